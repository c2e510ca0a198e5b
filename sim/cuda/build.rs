//! Link settings of the CUDA stand-in.
//!
//! - The cdylib gets the real driver's SONAME, `libcuda.so.1`: a program
//!   linked against it records `libcuda.so.1` as its dependency, exactly as
//!   one linked against NVIDIA's `libcuda.so` does, and the dynamic loader
//!   finds whichever `libcuda.so.1` its search path holds.
//! - `-Bsymbolic-functions`: the library's references to its own functions
//!   (the addresses `cuGetProcAddress` returns) bind to its own definitions,
//!   so an interposer exporting functions of the same names (`LD_PRELOAD`)
//!   cannot redirect them, as it cannot with the real driver.
//! - Integration tests export their symbols dynamically, so a test can
//!   define a function named like a driver export and check that it does
//!   not capture what `cuGetProcAddress` returns (`tests/interpose.rs`).
//! - `tessera-cuda-probe-linked` links against the cdylib cargo has just
//!   built in `target/<profile>/deps/` (the lib target is always built
//!   before the package's binaries), through the SONAME above.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-link-arg-tests=-Wl,--export-dynamic");
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    if let Some(profile_dir) = std::env::var_os("OUT_DIR")
        .map(std::path::PathBuf::from)
        .and_then(|out| out.ancestors().nth(3).map(std::path::Path::to_path_buf))
    {
        println!(
            "cargo:rustc-link-arg-bin=tessera-cuda-probe-linked=-L{}",
            profile_dir.join("deps").display()
        );
    }
}
