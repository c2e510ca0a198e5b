//! MIG profile catalogue.
