//! The driver libraries containers may get: the one table both the simulated
//! node (which installs them) and discovery (which looks for them) use.
//!
//! Pure data. A driver install ships each library as
//! `lib<name>.so.<driver version>`, a file whose `DT_SONAME` is either
//! `lib<name>.so.<N>` (then `ldconfig` or the installer makes that name a
//! link to the versioned file) or the versioned name itself (no link).

use crate::facts::LibraryGroup;

/// How a driver library's SONAME is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Soname {
    /// `lib<name>.so.<N>`, a link to the versioned file.
    Major(&'static str),
    /// The versioned file name itself, `lib<name>.so.<driver version>` (no link).
    Versioned,
}

/// One library of a driver install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverLibrary {
    /// Base name without `.so…`, e.g. `libnvidia-encode`.
    pub name: &'static str,
    /// How its SONAME is formed.
    pub soname: Soname,
    /// The group it belongs to.
    pub group: LibraryGroup,
    /// What it is, in a few words.
    pub what: &'static str,
}

impl DriverLibrary {
    /// The name without the version: `lib<name>.so`.
    pub fn stem(&self) -> String {
        format!("{}.so", self.name)
    }

    /// The versioned file name, `lib<name>.so.<driver_version>`.
    pub fn file_name(&self, driver_version: &str) -> String {
        format!("{}.so.{driver_version}", self.name)
    }

    /// The SONAME for `driver_version`.
    pub fn soname(&self, driver_version: &str) -> String {
        match self.soname {
            Soname::Major(n) => format!("{}.so.{n}", self.name),
            Soname::Versioned => self.file_name(driver_version),
        }
    }

    /// The SONAME when it does not depend on the driver version
    /// (`libcuda.so.1`); `None` where it is the versioned name.
    pub fn usual_soname(&self) -> Option<String> {
        match self.soname {
            Soname::Major(n) => Some(format!("{}.so.{n}", self.name)),
            Soname::Versioned => None,
        }
    }
}

const fn lib(
    name: &'static str,
    soname: Soname,
    group: LibraryGroup,
    what: &'static str,
) -> DriverLibrary {
    DriverLibrary {
        name,
        soname,
        group,
        what,
    }
}

use LibraryGroup::{Compute, Graphics, Video};
use Soname::{Major, Versioned};

/// Every library of a driver install that containers may get, with its
/// SONAME and group, in discovery order (the order of a spec's mounts), as a
/// `.run`/package install of the data-center driver lays them out.
pub const DRIVER_LIBRARIES: &[DriverLibrary] = &[
    lib("libcuda", Major("1"), Compute, "CUDA driver"),
    lib(
        "libnvidia-ml",
        Major("1"),
        Compute,
        "management library (NVML)",
    ),
    lib(
        "libnvidia-ptxjitcompiler",
        Major("1"),
        Compute,
        "PTX JIT compiler",
    ),
    lib("libnvidia-nvvm", Major("4"), Compute, "NVVM compiler"),
    lib("libnvidia-allocator", Major("1"), Compute, "GBM allocator"),
    lib(
        "libnvidia-cfg",
        Major("1"),
        Compute,
        "configuration library",
    ),
    lib("libnvidia-opencl", Major("1"), Compute, "OpenCL ICD"),
    lib(
        "libcudadebugger",
        Major("1"),
        Compute,
        "CUDA debugger back end",
    ),
    lib("libnvidia-gpucomp", Versioned, Compute, "GPU compiler"),
    lib(
        "libnvidia-pkcs11",
        Versioned,
        Compute,
        "PKCS #11 module (confidential computing, OpenSSL 1.1)",
    ),
    lib(
        "libnvidia-pkcs11-openssl3",
        Versioned,
        Compute,
        "PKCS #11 module (confidential computing, OpenSSL 3)",
    ),
    lib("libnvcuvid", Major("1"), Video, "video decoder (NVDEC)"),
    lib(
        "libnvidia-encode",
        Major("1"),
        Video,
        "video encoder (NVENC)",
    ),
    lib("libnvidia-opticalflow", Major("1"), Video, "optical flow"),
    lib("libnvidia-eglcore", Versioned, Graphics, "EGL core"),
    lib("libnvidia-glcore", Versioned, Graphics, "OpenGL core"),
    lib(
        "libnvidia-tls",
        Versioned,
        Graphics,
        "thread-local storage support",
    ),
    lib(
        "libnvidia-glsi",
        Versioned,
        Graphics,
        "OpenGL system interface",
    ),
    lib(
        "libnvidia-glvkspirv",
        Versioned,
        Graphics,
        "Vulkan SPIR-V compiler",
    ),
    lib("libEGL_nvidia", Major("0"), Graphics, "EGL vendor library"),
    lib("libGLX_nvidia", Major("0"), Graphics, "GLX vendor library"),
    lib(
        "libGLESv2_nvidia",
        Major("2"),
        Graphics,
        "OpenGL ES 2 vendor library",
    ),
    lib(
        "libGLESv1_CM_nvidia",
        Major("1"),
        Graphics,
        "OpenGL ES 1 vendor library",
    ),
    lib("libnvidia-rtcore", Versioned, Graphics, "ray-tracing core"),
    lib("libnvoptix", Major("1"), Graphics, "OptiX"),
    lib(
        "libnvidia-fbc",
        Major("1"),
        Graphics,
        "frame buffer capture (NvFBC)",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_sonames_are_formed_from_the_version_or_the_major() {
        for (i, a) in DRIVER_LIBRARIES.iter().enumerate() {
            assert!(
                a.name.starts_with("lib") && !a.name.contains(".so"),
                "{a:?}"
            );
            assert!(
                DRIVER_LIBRARIES[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
        }
        let cuda = DRIVER_LIBRARIES[0];
        assert_eq!(cuda.stem(), "libcuda.so");
        assert_eq!(cuda.file_name("570.1"), "libcuda.so.570.1");
        assert_eq!(cuda.soname("570.1"), "libcuda.so.1");
        assert_eq!(cuda.usual_soname().as_deref(), Some("libcuda.so.1"));
        let glcore = DRIVER_LIBRARIES
            .iter()
            .find(|l| l.name == "libnvidia-glcore")
            .expect("glcore");
        assert_eq!(glcore.soname("570.1"), "libnvidia-glcore.so.570.1");
        assert_eq!(glcore.usual_soname(), None);
    }
}
