//! CDI (Container Device Interface) spec types and rules.
//!
//! - [`spec`]: the spec file types, strict on read, and [`SpecProblem`];
//! - [`name`]: vendor, class, kind and device names, and qualified names;
//! - [`version`]: known versions and the minimum version a spec needs;
//! - [`validate`]: every problem of a spec, each naming its field, and
//!   [`Spec::new`], which validates and stamps the minimum `cdiVersion`;
//! - [`merge`]: folding container edits the way runtimes apply them;
//! - [`annotations`]: the `cdi.k8s.io/…` annotation form;
//! - [`transient`]: what a `tessera.io/alloc` spec must carry for the hook
//!   ([`Spec::validate_tessera`]).
//!
//! The rules follow the reference Go library, `tags.cncf.io/container-device-interface`
//! (spec 1.1.0), which containerd, CRI-O and podman load specs with.

pub mod annotations;
pub mod merge;
pub mod name;
pub mod spec;
pub mod transient;
pub mod validate;
pub mod version;

pub use annotations::{
    AnnotationError, CdiAnnotations, annotation_key, annotation_key_shortened, annotation_value,
    parse_annotation_value, parse_annotations, tessera_annotation,
};
pub use merge::DeviceCgroupRule;
pub use name::{Class, DeviceName, Kind, NameError, QualifiedName, Vendor};
pub use spec::{
    ContainerEdits, Device, DeviceNode, HOOK_NAMES, Hook, IntelRdt, Mount, NetDevice, Spec,
    SpecError, SpecProblem,
};
pub use version::{CdiVersion, VersionError, minimum_version};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::cdi::{ALLOC_KIND, GPU_KIND, VENDOR};

    #[test]
    fn contract_kinds_are_valid_and_share_the_vendor() {
        for kind in [GPU_KIND, ALLOC_KIND] {
            let parsed = Kind::parse(kind).expect("contract kind is valid");
            assert_eq!(parsed.vendor.as_str(), VENDOR);
            assert!(
                !parsed.class.as_str().contains('.'),
                "no 0.6.0 needed for {kind}"
            );
        }
    }
}
