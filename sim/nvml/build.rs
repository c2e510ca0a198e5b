//! Link settings of the NVML stand-in: the cdylib gets the real library's
//! SONAME, `libnvidia-ml.so.1`, so a program linked against it records that
//! dependency (as one linked with `-lnvidia-ml` does) and `ldconfig` files
//! the node's versioned `libnvidia-ml.so.<driver version>` under it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
