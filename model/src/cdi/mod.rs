//! CDI (Container Device Interface) spec types and rules.

pub mod spec;

pub use spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
