//! TODO(transient): being written.
