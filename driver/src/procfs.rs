//! procfs
