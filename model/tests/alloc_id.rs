//! The allocation id rules: what `AllocId::new` accepts and refuses, and that
//! every accepted id also works where the contract uses it (CDI device name,
//! annotation, spec file name).

use proptest::prelude::*;
use tessera_model::alloc::{AllocId, AllocIdError, MAX_LEN};
use tessera_model::cdi::{QualifiedName, name::validate_device_name, tessera_annotation};

#[test]
fn hostile_ids_are_refused_with_one_line_errors() {
    for (input, expect) in [
        ("", "allocation id is empty"),
        ("../etc", "character '.' at byte 0"),
        ("a/../b", "character '/' at byte 1"),
        ("abc\0", "character '\\0' at byte 3"),
        ("Abc-0", "character 'A' at byte 0"),
        ("pod-UID-0", "character 'U' at byte 4"),
        ("a b", "character ' ' at byte 1"),
        ("a_b", "character '_' at byte 1"),
        ("é1", "character 'é' at byte 0"),
        ("-abc", "found '-' at byte 0"),
        ("abc-", "found '-' at byte 3"),
    ] {
        let err = AllocId::new(input).expect_err(input);
        let line = err.to_string();
        assert!(
            line.contains(expect),
            "{input:?}: {line:?} lacks {expect:?}"
        );
        assert!(!line.contains('\n'), "{input:?}: multi-line error {line:?}");
    }
    let long = "a".repeat(300);
    assert_eq!(
        AllocId::new(&long),
        Err(AllocIdError::TooLong {
            len: 300,
            max: MAX_LEN
        })
    );
    assert!(AllocId::new(&"a".repeat(MAX_LEN)).is_ok());
    assert!(AllocId::new(&"a".repeat(MAX_LEN + 1)).is_err());
}

#[test]
fn one_character_ids_are_fine() {
    for id in ["a", "0", "z9"] {
        assert_eq!(AllocId::new(id).map(|a| a.to_string()), Ok(id.to_owned()));
    }
}

proptest! {
    #[test]
    fn every_contract_shaped_id_is_accepted_and_usable(
        id in "[a-z0-9]([a-z0-9-]{0,98}[a-z0-9])?"
    ) {
        let alloc = AllocId::new(&id).expect("contract-shaped id");
        prop_assert_eq!(alloc.as_str(), id.as_str());
        prop_assert!(validate_device_name(alloc.as_str()).is_ok());
        prop_assert!(QualifiedName::parse(&alloc.qualified_name()).is_ok());
        prop_assert!(tessera_annotation(alloc.as_str()).is_ok());
        let file = alloc.spec_file_name();
        prop_assert!(!file.contains('/'));
        prop_assert!(file.len() < 255);
    }

    #[test]
    fn anything_else_is_refused_and_never_panics(id in any::<String>()) {
        let ok = !id.is_empty()
            && id.len() <= MAX_LEN
            && id.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
            && !id.starts_with('-')
            && !id.ends_with('-');
        prop_assert_eq!(AllocId::new(&id).is_ok(), ok, "{:?}", id);
    }
}
