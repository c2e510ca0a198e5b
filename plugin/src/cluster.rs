//! TODO(cluster): being written.
