//! CDI names: vendor, class, kind (`vendor/class`), device name, and the
//! qualified device name `vendor/class=name`.
//!
//! The rules are those of the reference parser
//! (`tags.cncf.io/container-device-interface/pkg/parser`), ASCII only:
//!
//! | part | first | inside | last |
//! |---|---|---|---|
//! | vendor | letter | letter, digit, `-`, `_`, `.` | letter or digit |
//! | class | letter | letter, digit, `-`, `_`, `.` | letter or digit |
//! | device name | letter or digit | letter, digit, `-`, `_`, `.`, `:` | letter or digit |
//!
//! A one-character name only has to satisfy the rule for its first character.
//! A dot in the class needs cdiVersion 0.6.0 and a device name starting with a
//! digit needs 0.5.0; those are version rules (see [`super::version`]), not
//! name rules, so the parsers here accept both.

use std::fmt;
use std::str::FromStr;

/// Which part of a CDI name a [`NameError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamePart {
    /// The vendor, before the `/` of a kind.
    Vendor,
    /// The class, after the `/` of a kind.
    Class,
    /// The device name, after the `=` of a qualified name.
    Device,
}

impl fmt::Display for NamePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamePart::Vendor => "vendor",
            NamePart::Class => "class",
            NamePart::Device => "device",
        })
    }
}

/// Why a CDI name was rejected; every message is one line naming the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The part is empty.
    #[error("{part} name is empty")]
    Empty {
        /// Which part.
        part: NamePart,
    },
    /// A vendor or class does not start with an ASCII letter.
    #[error("{part} name {value:?}: must start with a letter")]
    StartNotLetter {
        /// Which part.
        part: NamePart,
        /// The rejected name.
        value: String,
    },
    /// A device name does not start with an ASCII letter or digit.
    #[error("{part} name {value:?}: must start with a letter or digit")]
    StartNotAlphanumeric {
        /// Which part.
        part: NamePart,
        /// The rejected name.
        value: String,
    },
    /// The name does not end with an ASCII letter or digit.
    #[error("{part} name {value:?}: must end with a letter or digit")]
    EndNotAlphanumeric {
        /// Which part.
        part: NamePart,
        /// The rejected name.
        value: String,
    },
    /// A character inside the name is not allowed there.
    #[error(
        "{part} name {value:?}: character {found:?} is not allowed; use letters, digits and {allowed}"
    )]
    BadCharacter {
        /// Which part.
        part: NamePart,
        /// The rejected name.
        value: String,
        /// The first offending character.
        found: char,
        /// The punctuation the part allows inside, for the message.
        allowed: &'static str,
    },
    /// A kind is not of the form `vendor/class`.
    #[error("kind {value:?}: expected \"vendor/class\"")]
    KindForm {
        /// The rejected kind.
        value: String,
    },
    /// A kind has the right form but a bad vendor or class.
    #[error("kind {value:?}: {reason}")]
    Kind {
        /// The rejected kind.
        value: String,
        /// What is wrong with its vendor or class.
        reason: Box<NameError>,
    },
    /// A qualified name is not of the form `vendor/class=name`.
    #[error("qualified device name {value:?}: expected \"vendor/class=name\"")]
    QualifiedForm {
        /// The rejected qualified name.
        value: String,
    },
    /// A qualified name has the right form but a bad vendor, class or device name.
    #[error("qualified device name {value:?}: {reason}")]
    Qualified {
        /// The rejected qualified name.
        value: String,
        /// What is wrong with one of its parts.
        reason: Box<NameError>,
    },
}

const VENDOR_CLASS_INSIDE: &str = "'-', '_', '.'";
const DEVICE_INSIDE: &str = "'-', '_', '.', ':'";

fn check(part: NamePart, value: &str) -> Result<(), NameError> {
    let bytes = value.as_bytes();
    let Some(&first) = bytes.first() else {
        return Err(NameError::Empty { part });
    };
    let owned = || value.to_owned();
    match part {
        NamePart::Vendor | NamePart::Class if !first.is_ascii_alphabetic() => {
            return Err(NameError::StartNotLetter {
                part,
                value: owned(),
            });
        }
        NamePart::Device if !first.is_ascii_alphanumeric() => {
            return Err(NameError::StartNotAlphanumeric {
                part,
                value: owned(),
            });
        }
        _ => {}
    }
    // `first` is ASCII, so the name has at least one char and the rest starts on a boundary.
    let rest = &value[1..];
    let mut chars = rest.chars();
    let Some(last) = chars.next_back() else {
        return Ok(());
    };
    let (punct, allowed): (&[char], _) = match part {
        NamePart::Device => (&['-', '_', '.', ':'], DEVICE_INSIDE),
        NamePart::Vendor | NamePart::Class => (&['-', '_', '.'], VENDOR_CLASS_INSIDE),
    };
    if let Some(found) = chars.find(|c| !(c.is_ascii_alphanumeric() || punct.contains(c))) {
        return Err(NameError::BadCharacter {
            part,
            value: owned(),
            found,
            allowed,
        });
    }
    if !last.is_ascii_alphanumeric() {
        // A non-ASCII last character is reported as a bad character, as it is inside.
        if !last.is_ascii() {
            return Err(NameError::BadCharacter {
                part,
                value: owned(),
                found: last,
                allowed,
            });
        }
        return Err(NameError::EndNotAlphanumeric {
            part,
            value: owned(),
        });
    }
    Ok(())
}

/// Checks a vendor name (`tessera.io`): a letter first, then letters, digits,
/// `-`, `_`, `.`, ending in a letter or digit.
pub fn validate_vendor(vendor: &str) -> Result<(), NameError> {
    check(NamePart::Vendor, vendor)
}

/// Checks a class name (`gpu`): the same rules as a vendor; a dot is allowed
/// by the parser but needs cdiVersion 0.6.0.
pub fn validate_class(class: &str) -> Result<(), NameError> {
    check(NamePart::Class, class)
}

/// Checks a device name (`0`, `GPU-…`, `0:1`): a letter or digit first, then
/// letters, digits, `-`, `_`, `.`, `:`, ending in a letter or digit.
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    check(NamePart::Device, name)
}

/// Checks a kind `vendor/class`.
pub fn validate_kind(kind: &str) -> Result<(), NameError> {
    Kind::parse(kind).map(|_| ())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $validate:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $ty(String);

        impl $ty {
            /// Validates and wraps a name.
            pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
                let value = value.into();
                $validate(&value)?;
                Ok(Self(value))
            }

            /// The name as written.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $ty {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl From<$ty> for String {
            fn from(value: $ty) -> String {
                value.0
            }
        }
    };
}

name_type!(
    /// A valid CDI vendor, e.g. `tessera.io`.
    Vendor,
    validate_vendor
);
name_type!(
    /// A valid CDI class, e.g. `gpu` or `alloc`.
    Class,
    validate_class
);
name_type!(
    /// A valid CDI device name, e.g. `0`, `all`, `MIG-…` or `0:1`.
    DeviceName,
    validate_device_name
);

/// A valid CDI kind, `vendor/class`: what a spec file declares.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind {
    /// The vendor, before the `/`.
    pub vendor: Vendor,
    /// The class, after the `/`.
    pub class: Class,
}

impl Kind {
    /// Joins a vendor and a class.
    pub fn new(vendor: Vendor, class: Class) -> Self {
        Self { vendor, class }
    }

    /// Parses `vendor/class`, splitting at the first `/` as the reference parser does.
    pub fn parse(kind: &str) -> Result<Self, NameError> {
        let (vendor, class) = kind
            .split_once('/')
            .filter(|(v, c)| !v.is_empty() && !c.is_empty())
            .ok_or_else(|| NameError::KindForm {
                value: kind.to_owned(),
            })?;
        let wrap = |reason| NameError::Kind {
            value: kind.to_owned(),
            reason: Box::new(reason),
        };
        Ok(Self {
            vendor: Vendor::new(vendor).map_err(wrap)?,
            class: Class::new(class).map_err(wrap)?,
        })
    }

    /// The qualified name of one device of this kind.
    pub fn qualify(&self, name: DeviceName) -> QualifiedName {
        QualifiedName {
            vendor: self.vendor.clone(),
            class: self.class.clone(),
            name,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl FromStr for Kind {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        Self::parse(s)
    }
}

/// A fully qualified CDI device name, `vendor/class=name`: what a runtime is asked for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    /// The vendor, e.g. `tessera.io`.
    pub vendor: Vendor,
    /// The class, e.g. `alloc`.
    pub class: Class,
    /// The device name within the kind.
    pub name: DeviceName,
}

impl QualifiedName {
    /// Parses `vendor/class=name`, splitting at the first `=` and then at the
    /// first `/`, as the reference parser does.
    pub fn parse(value: &str) -> Result<Self, NameError> {
        let form = || NameError::QualifiedForm {
            value: value.to_owned(),
        };
        if value.starts_with('/') {
            return Err(form());
        }
        let (qualifier, name) = value.split_once('=').ok_or_else(form)?;
        let (vendor, class) = qualifier.split_once('/').ok_or_else(form)?;
        if vendor.is_empty() || class.is_empty() || name.is_empty() {
            return Err(form());
        }
        let wrap = |reason| NameError::Qualified {
            value: value.to_owned(),
            reason: Box::new(reason),
        };
        Ok(Self {
            vendor: Vendor::new(vendor).map_err(wrap)?,
            class: Class::new(class).map_err(wrap)?,
            name: DeviceName::new(name).map_err(wrap)?,
        })
    }

    /// The kind part, `vendor/class`.
    pub fn kind(&self) -> Kind {
        Kind::new(self.vendor.clone(), self.class.clone())
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_rules_accept_the_reference_good_names() {
        for good in [
            "a",
            "tessera.io",
            "nvidia.com",
            "vendor-1",
            "v_e.n-d0r",
            "A",
            "Z9",
            "example.com",
        ] {
            assert_eq!(
                validate_vendor(good),
                Ok(()),
                "vendor {good:?} should be valid"
            );
        }
    }

    #[test]
    fn vendor_rules_reject_bad_names_with_the_rule_broken() {
        let cases = [
            ("", "vendor name is empty"),
            ("1abc", "vendor name \"1abc\": must start with a letter"),
            ("-abc", "vendor name \"-abc\": must start with a letter"),
            (".io", "vendor name \".io\": must start with a letter"),
            (
                "abc-",
                "vendor name \"abc-\": must end with a letter or digit",
            ),
            (
                "abc.",
                "vendor name \"abc.\": must end with a letter or digit",
            ),
            (
                "ab:c",
                "vendor name \"ab:c\": character ':' is not allowed; use letters, digits and '-', '_', '.'",
            ),
            (
                "a/b",
                "vendor name \"a/b\": character '/' is not allowed; use letters, digits and '-', '_', '.'",
            ),
            (
                "aé1",
                "vendor name \"aé1\": character 'é' is not allowed; use letters, digits and '-', '_', '.'",
            ),
            (
                "aé",
                "vendor name \"aé\": character 'é' is not allowed; use letters, digits and '-', '_', '.'",
            ),
        ];
        for (bad, message) in cases {
            let err = validate_vendor(bad).expect_err(bad);
            assert_eq!(err.to_string(), message, "vendor {bad:?}");
        }
    }

    #[test]
    fn class_allows_dots_like_the_reference_parser() {
        // The reference shares one validator for vendor and class; a dot in the
        // class is a version question (0.6.0), not a syntax error.
        for good in ["gpu", "alloc", "g.p.u", "a_b-c", "x", "Gpu2"] {
            assert_eq!(validate_class(good), Ok(()), "class {good:?}");
        }
        let cases = [
            ("", "class name is empty"),
            ("2gpu", "class name \"2gpu\": must start with a letter"),
            (
                "gpu_",
                "class name \"gpu_\": must end with a letter or digit",
            ),
            (
                "g=u",
                "class name \"g=u\": character '=' is not allowed; use letters, digits and '-', '_', '.'",
            ),
        ];
        for (bad, message) in cases {
            assert_eq!(validate_class(bad).expect_err(bad).to_string(), message);
        }
    }

    #[test]
    fn device_name_rules() {
        for good in [
            "0",
            "all",
            "GPU-5f3a1c1e-8c9d-4e5f-9a0b-1c2d3e4f5a6b",
            "MIG-5f3a1c1e-8c9d-4e5f-9a0b-1c2d3e4f5a6b",
            "0:1",
            "a.b_c-d:e",
            "9",
            "x",
            "3f2b7c1a-0000-4000-8000-000000000000-0",
        ] {
            assert_eq!(validate_device_name(good), Ok(()), "device {good:?}");
        }
        let cases = [
            ("", "device name is empty"),
            (
                "-x",
                "device name \"-x\": must start with a letter or digit",
            ),
            (
                ":0",
                "device name \":0\": must start with a letter or digit",
            ),
            ("x-", "device name \"x-\": must end with a letter or digit"),
            ("0:", "device name \"0:\": must end with a letter or digit"),
            (
                "a/b",
                "device name \"a/b\": character '/' is not allowed; use letters, digits and '-', '_', '.', ':'",
            ),
            (
                "a b",
                "device name \"a b\": character ' ' is not allowed; use letters, digits and '-', '_', '.', ':'",
            ),
            (
                "a=b",
                "device name \"a=b\": character '=' is not allowed; use letters, digits and '-', '_', '.', ':'",
            ),
        ];
        for (bad, message) in cases {
            assert_eq!(
                validate_device_name(bad).expect_err(bad).to_string(),
                message
            );
        }
    }

    #[test]
    fn kind_parses_and_names_the_bad_part() {
        let kind = Kind::parse("tessera.io/gpu").expect("valid kind");
        assert_eq!(kind.vendor.as_str(), "tessera.io");
        assert_eq!(kind.class.as_str(), "gpu");
        assert_eq!(kind.to_string(), "tessera.io/gpu");
        assert_eq!(validate_kind("tessera.io/g.pu"), Ok(()));

        let cases = [
            (
                "tessera.io",
                "kind \"tessera.io\": expected \"vendor/class\"",
            ),
            ("/gpu", "kind \"/gpu\": expected \"vendor/class\""),
            (
                "tessera.io/",
                "kind \"tessera.io/\": expected \"vendor/class\"",
            ),
            ("", "kind \"\": expected \"vendor/class\""),
            (
                "1x/gpu",
                "kind \"1x/gpu\": vendor name \"1x\": must start with a letter",
            ),
            (
                "a/b/c",
                "kind \"a/b/c\": class name \"b/c\": character '/' is not allowed; use letters, digits and '-', '_', '.'",
            ),
        ];
        for (bad, message) in cases {
            assert_eq!(validate_kind(bad).expect_err(bad).to_string(), message);
        }
    }

    #[test]
    fn qualified_name_parses_and_displays() {
        let q = QualifiedName::parse("tessera.io/alloc=abc-0").expect("valid");
        assert_eq!(q.vendor.as_str(), "tessera.io");
        assert_eq!(q.class.as_str(), "alloc");
        assert_eq!(q.name.as_str(), "abc-0");
        assert_eq!(q.to_string(), "tessera.io/alloc=abc-0");
        assert_eq!(q.kind().to_string(), "tessera.io/alloc");
        assert_eq!(
            "tessera.io/alloc=abc-0".parse::<QualifiedName>(),
            Ok(q.clone())
        );
        let kind = Kind::parse("tessera.io/alloc").expect("valid");
        assert_eq!(kind.qualify(DeviceName::new("abc-0").expect("valid")), q);
    }

    #[test]
    fn qualified_name_rejects_bad_forms_and_parts() {
        let cases = [
            (
                "",
                "qualified device name \"\": expected \"vendor/class=name\"",
            ),
            (
                "gpu0",
                "qualified device name \"gpu0\": expected \"vendor/class=name\"",
            ),
            (
                "/dev/nvidia0",
                "qualified device name \"/dev/nvidia0\": expected \"vendor/class=name\"",
            ),
            (
                "vendor.com/class",
                "qualified device name \"vendor.com/class\": expected \"vendor/class=name\"",
            ),
            (
                "vendor.com=dev",
                "qualified device name \"vendor.com=dev\": expected \"vendor/class=name\"",
            ),
            (
                "vendor.com/class=",
                "qualified device name \"vendor.com/class=\": expected \"vendor/class=name\"",
            ),
            (
                "/class=dev",
                "qualified device name \"/class=dev\": expected \"vendor/class=name\"",
            ),
            (
                "vendor.com/=dev",
                "qualified device name \"vendor.com/=dev\": expected \"vendor/class=name\"",
            ),
            (
                "nvidia.com/gpu=-x",
                "qualified device name \"nvidia.com/gpu=-x\": device name \"-x\": must start with a letter or digit",
            ),
            (
                "nvidia.com/gpu=a=b",
                "qualified device name \"nvidia.com/gpu=a=b\": device name \"a=b\": character '=' is not allowed; use letters, digits and '-', '_', '.', ':'",
            ),
            (
                "1nvidia.com/gpu=0",
                "qualified device name \"1nvidia.com/gpu=0\": vendor name \"1nvidia.com\": must start with a letter",
            ),
        ];
        for (bad, message) in cases {
            let err = QualifiedName::parse(bad).expect_err(bad);
            assert_eq!(err.to_string(), message, "input {bad:?}");
        }
    }

    #[test]
    fn newtypes_validate_on_construction() {
        assert!(Vendor::new("tessera.io").is_ok());
        assert!(Vendor::new("tessera.io.").is_err());
        assert!(Class::new("gpu").is_ok());
        assert!(DeviceName::new("0").is_ok());
        assert!(DeviceName::new("").is_err());
        assert_eq!(String::from(Class::new("gpu").expect("valid")), "gpu");
    }
}
