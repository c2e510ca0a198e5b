//! TODO(inventory): being written.
