//! TODO(devices): being written.
