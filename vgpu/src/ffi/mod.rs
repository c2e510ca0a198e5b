//! Everything raw: the C types of the driver and NVML calls the library
//! intercepts, the exported wrappers, the lookup of the real functions, and
//! the `dlsym` / `cuGetProcAddress` answers. The decisions (charge or
//! refuse, wait or launch) are made by the safe modules (`memory`,
//! `limiter`, `vmm`, `pools`, `contexts`); this module reads and writes the
//! caller's pointers and calls the real functions. Nothing below it reaches
//! back up: the runtime and the limiter get the driver through the
//! `runtime::Platform` and `limiter::Host` seams this module provides.
//!
//! # Entry points
//!
//! Each intercepted entry point is declared once, with `intercept!` (in
//! [`intercept`]): its C signature, its [`Hook`](crate::names::Hook), and
//! its body. The declaration makes the exported `#[no_mangle]` function,
//! the named type of its pointer (`cuMemAlloc_v2::Pfn`), the accessor of
//! the real function typed by it (`cuMemAlloc_v2::real()`), and a
//! compile-time check that the export has exactly that type. The registry in `names` lists
//! every hook with its symbol; the table of exports (`intercept::wrapper`,
//! what `dlsym` and `cuGetProcAddress` answer) is built from that list, and
//! checks at compile time that each symbol's export was declared for its
//! hook. Adding an entry point is one line in the registry and one
//! `intercept!`; either without the other does not compile.
//!
//! # Real functions
//!
//! Each intercepted entry point has one cached real pointer (an
//! `AtomicPtr`, resolved once, then one atomic load per call). It is seeded
//! by the first route that meets the real function: `dlsym` on the caller's
//! handle, the real `cuGetProcAddress`'s answer, or failing those the real
//! `dlsym` on `dlopen("libcuda.so.1", RTLD_NOLOAD)` (NVML:
//! `libnvidia-ml.so.1`), then `RTLD_NEXT`. Our own wrappers are never taken
//! for real functions ([`resolve`]).
//!
//! # `dlsym`
//!
//! The exported `dlsym` answers intercepted names with wrappers (when the
//! caller's handle has the real symbol) and everything else through the
//! real `dlsym`, found with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`
//! (`GLIBC_2.2.5` on older glibc). On x86-64 it is a naked trampoline: the
//! real `dlsym` is *jumped* to with the caller's return address intact, so
//! `dlsym(RTLD_NEXT, …)` keeps meaning "after the caller", for every other
//! interposer in the process. Elsewhere it is a plain function (and
//! `RTLD_NEXT` lookups by other libraries resolve relative to this one)
//! ([`dlsym`]).
//!
//! # Panics
//!
//! Every exported function catches panics: before the driver was called,
//! the call is passed through; after, the driver's result is returned. One
//! line on stderr says it happened ([`guard`]).
//!
//! # Files, by subject
//!
//! [`types`] (C types), [`intercept`] (the declaration macro and the table
//! of exports), [`resolve`] (real functions), [`guard`] (panics),
//! [`driver`] (what the library asks the driver itself), [`alloc`],
//! [`free`], [`arrays`], [`info`] (memory), [`launch`], [`procaddr`],
//! [`dlsym`], [`nvml`], [`vmm`], [`pools`], [`contexts`].
#![allow(non_snake_case)]

// The macro first: the modules after it declare their entry points with it.
#[macro_use]
mod intercept;

mod alloc;
mod arrays;
mod contexts;
mod dlsym;
mod driver;
mod free;
mod guard;
mod info;
mod launch;
mod nvml;
mod pools;
mod procaddr;
mod resolve;
mod types;
mod vmm;
