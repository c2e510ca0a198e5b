//! TODO(server): being written.
