//! `stress`: THREADS threads, each with the primary context of one device
//! current, making random allocations and frees over every allocation API
//! (linear, pitched, managed, VMM in the CUDA samples' release-before-unmap
//! order and NCCL's retain order, stream-ordered from the device's pool and
//! from a pool of the thread's own, both keeping all they free, arrays) with
//! random sizes, until OPS operations each. Refusals are
//! expected (the point is to run into the limit); any other error is
//! reported. Prints `state=running` once every thread holds its context,
//! and `ops=`, `refused=`, `errors=`, `held_bytes=` (what the blocks still
//! held at the end take) when done; with `--hold`, `state=holding` and
//! waits for a line on stdin before freeing them.

use std::ffi::{c_int, c_void};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Args;

use crate::cuda::*;

const MIB: usize = 1 << 20;
const OUT_OF_MEMORY: CuResult = 2;

/// Arguments of `stress`.
#[derive(Args)]
pub struct StressArgs {
    /// Seed of the random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Operations per thread.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Largest block, MiB (blocks are 1..=MAX MiB; VMM rounds up to 2 MiB).
    #[arg(long, default_value_t = 64)]
    max_mib: usize,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: c_int,
    /// Keep the last blocks until a line arrives on stdin.
    #[arg(long)]
    hold: bool,
}

/// One thread's leftovers: its blocks, stream and pool (raw driver
/// handles, used by one thread at a time).
struct Leftover(Vec<(Block, usize)>, Handle, Handle);

// SAFETY: the handles are driver objects, valid from any thread of the
// process; the main thread uses them only after their thread ended.
unsafe impl Send for Leftover {}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Runs the stress.
pub fn run(route: Route, args: &StressArgs) -> Result<(), Box<dyn std::error::Error>> {
    let api = load(route)?;
    // SAFETY: cuInit takes a flags word.
    api.check("cuInit", unsafe { (api.init)(0) })?;
    let ops = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let ready = std::sync::Barrier::new(args.threads + 1);
    let leftovers: Vec<Leftover> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (api, ops, refused, errors, ready) = (&api, &ops, &refused, &errors, &ready);
                s.spawn(move || {
                    let mut rng = Rng((args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        ^ (t as u64 + 1) << 32)
                        | 1);
                    worker(api, args, &mut rng, ready, ops, refused, errors)
                })
            })
            .collect();
        ready.wait();
        println!("state=running");
        let _ = std::io::stdout().flush();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let held: usize = leftovers
        .iter()
        .flat_map(|l| l.0.iter().map(|(_, bytes)| bytes))
        .sum();
    println!("ops={}", ops.load(Ordering::Relaxed));
    println!("refused={}", refused.load(Ordering::Relaxed));
    println!("errors={}", errors.load(Ordering::Relaxed));
    println!("held_bytes={held}");
    if args.hold {
        println!("state=holding");
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    // SAFETY: this thread takes the primary context too, then frees what
    // the workers left with the calls that match.
    unsafe {
        let mut ctx = std::ptr::null_mut();
        let _ = (api.primary_ctx_retain)(&mut ctx, args.device);
        let _ = (api.ctx_set_current)(ctx);
        let mut rng = Rng(args.seed | 1);
        for Leftover(blocks, stream, pool) in leftovers {
            for (block, _) in blocks {
                let _ = free(&api, block, stream, &mut rng);
            }
            let _ = (api.stream_synchronize)(stream);
            let _ = (api.stream_destroy)(stream);
            if !pool.is_null() {
                let _ = (api.mem_pool_destroy)(pool);
            }
        }
    }
    Ok(())
}

fn worker(
    api: &Api,
    args: &StressArgs,
    rng: &mut Rng,
    ready: &std::sync::Barrier,
    ops: &AtomicU64,
    refused: &AtomicU64,
    errors: &AtomicU64,
) -> Leftover {
    let mut blocks: Vec<(Block, usize)> = Vec::new();
    let mut stream = std::ptr::null_mut();
    let mut own_pool = std::ptr::null_mut();
    // SAFETY: cuda.h contracts with live out-pointers; every handle freed
    // below was made here.
    unsafe {
        let mut ctx = std::ptr::null_mut();
        let _ = (api.primary_ctx_retain)(&mut ctx, args.device);
        let _ = (api.ctx_set_current)(ctx);
        let _ = (api.stream_create)(&mut stream, 0);
        let mut pool = std::ptr::null_mut();
        if (api.device_get_mem_pool)(&mut pool, args.device) == SUCCESS {
            // What PyTorch's cudaMallocAsync backend sets: keep everything.
            let mut max = u64::MAX;
            let _ = (api.mem_pool_set_attribute)(pool, 4, (&raw mut max).cast());
        }
        let props = MemPoolProps {
            alloc_type: 1,
            handle_types: 0,
            location: MemLocation {
                kind: 1,
                id: args.device,
            },
            win32_security_attributes: std::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        };
        if (api.mem_pool_create)(&mut own_pool, &props) == SUCCESS {
            let mut max = u64::MAX;
            let _ = (api.mem_pool_set_attribute)(own_pool, 4, (&raw mut max).cast());
        }
    }
    ready.wait();
    let note = |rc: CuResult| {
        if rc == OUT_OF_MEMORY {
            refused.fetch_add(1, Ordering::Relaxed);
        } else if rc != SUCCESS {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    };
    for _ in 0..args.ops {
        ops.fetch_add(1, Ordering::Relaxed);
        let free_now = !blocks.is_empty() && rng.below(5) < 2;
        if free_now {
            let i = rng.below(blocks.len() as u64) as usize;
            let (block, _) = blocks.swap_remove(i);
            note(free(api, block, stream, rng));
            continue;
        }
        let bytes = (1 + rng.below(args.max_mib as u64) as usize) * MIB;
        match alloc(api, args.device, bytes, (stream, own_pool), rng) {
            Ok(block) => blocks.push(block),
            Err(rc) => note(rc),
        }
    }
    Leftover(blocks, stream, own_pool)
}

/// One block of about `bytes` by a random API: the block and its size.
fn alloc(
    api: &Api,
    device: c_int,
    bytes: usize,
    (stream, pool): (Handle, Handle),
    rng: &mut Rng,
) -> Result<(Block, usize), CuResult> {
    let ok = |rc: CuResult| if rc == SUCCESS { Ok(()) } else { Err(rc) };
    // SAFETY: cuda.h contracts; live out-pointers and descriptors.
    unsafe {
        match rng.below(7) {
            0 => {
                let mut p = 0;
                ok((api.mem_alloc)(&mut p, bytes))?;
                Ok((Block::Linear(p), bytes))
            }
            1 => {
                let (mut p, mut pitch) = (0, 0);
                ok((api.mem_alloc_pitch)(
                    &mut p,
                    &mut pitch,
                    MIB,
                    bytes / MIB,
                    4,
                ))?;
                Ok((Block::Linear(p), pitch * (bytes / MIB)))
            }
            2 => {
                let size = bytes.next_multiple_of(2 * MIB);
                let prop = MemAllocationProp {
                    kind: 1,
                    requested_handle_types: 0,
                    location: MemLocation {
                        kind: 1,
                        id: device,
                    },
                    win32_handle_meta_data: std::ptr::null_mut(),
                    alloc_flags: [0; 8],
                };
                let mut handle = 0;
                ok((api.mem_create)(&mut handle, size, &prop, 0))?;
                let mut va = 0;
                if let Err(rc) = ok((api.mem_address_reserve)(&mut va, size, 0, 0, 0)) {
                    (api.mem_release)(handle);
                    return Err(rc);
                }
                if let Err(rc) = ok((api.mem_map)(va, size, 0, handle, 0)) {
                    (api.mem_address_free)(va, size);
                    (api.mem_release)(handle);
                    return Err(rc);
                }
                // The CUDA samples' order: the handle goes at once, the
                // mapping keeps the memory.
                let _ = (api.mem_release)(handle);
                Ok((Block::Vmm { va, size, handle }, size))
            }
            3 => {
                let mut p = 0;
                ok((api.mem_alloc_async)(&mut p, bytes, stream))?;
                Ok((Block::Async(p), bytes))
            }
            4 if !pool.is_null() => {
                let mut p = 0;
                ok((api.mem_alloc_from_pool_async)(&mut p, bytes, pool, stream))?;
                Ok((Block::Async(p), bytes))
            }
            5 => {
                let mut p = 0;
                ok((api.mem_alloc_managed)(&mut p, bytes, 1))?;
                Ok((Block::Linear(p), 0))
            }
            _ => {
                let d = ArrayDescriptor::floats(1024, bytes / 4096);
                let mut h = std::ptr::null_mut();
                ok((api.array_create)(&mut h, &d))?;
                Ok((Block::Array(h), bytes))
            }
        }
    }
}

fn free(api: &Api, block: Block, stream: Handle, rng: &mut Rng) -> CuResult {
    // SAFETY: frees what `alloc` made, with the matching calls.
    unsafe {
        match block {
            Block::Linear(p) => (api.mem_free)(p),
            Block::Vmm { va, size, handle } => {
                if rng.below(2) == 0 {
                    // NCCL's order: retain the handle of the mapping, release
                    // it, then unmap and free the range.
                    let mut again = 0;
                    let rc = (api.mem_retain_allocation_handle)(&mut again, va as *mut c_void);
                    if rc == SUCCESS {
                        let _ = (api.mem_release)(again);
                    }
                }
                let _ = handle;
                let rc = (api.mem_unmap)(va, size);
                let rc2 = (api.mem_address_free)(va, size);
                if rc != SUCCESS { rc } else { rc2 }
            }
            Block::Async(p) => (api.mem_free_async)(p, stream),
            Block::Array(h) => (api.array_destroy)(h),
            Block::Host(p) => (api.mem_free_host)(p),
            Block::Mipmap(h) => (api.mipmapped_array_destroy)(h),
        }
    }
}
