//! Fixtures of Tessera's end-to-end tests that only they use: a GPU cluster
//! on the stand-in API server for the scheduler extender ([`gpu_cluster`]), the hook's
//! host-side set-up ([`hookenv`]), the proof that the hook under test ran in
//! a container and the naive hook the security tests must catch
//! ([`hooktrace`]), the root filesystems of the library-visibility tests
//! ([`ldimage`]), the device plugin's cluster ([`plugin_cluster`]: the
//! simulated cluster with the extender and one real plugin per node), the
//! hostile-rootfs tripwires ([`sentinel`]), and gRPC
//! over a unix socket ([`unix_grpc`]).
//! Everything shared with other crates' tests (the prerequisite rule,
//! simulated nodes, bundles, runtimes, podman, containerd) is in
//! `tessera-test-support`.

pub mod gpu_cluster;
pub mod hookenv;
pub mod hooktrace;
pub mod ldimage;
pub mod plugin_cluster;
pub mod sentinel;
pub mod unix_grpc;
