//! Third-party conformance vectors, read in place from `../shared/conformance/`:
//! JSONTestSuite for the strict decoder, cyberphone's RFC 8785 vectors for the
//! canonical form.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::{DecodeError, Limits, canonical_json, parse_strict};
use crate::prerequisites::suite_dir;

/// Every `i_` (implementation-defined) file and the one outcome our policy
/// gives it (DESIGN §2.1): rejected, with this reason, at this byte.
const IMPLEMENTATION_DEFINED: [(&str, &str, usize); 35] = [
    (
        "i_number_double_huge_neg_exp.json",
        "number_out_of_range",
        1,
    ),
    ("i_number_huge_exp.json", "number_out_of_range", 1),
    ("i_number_neg_int_huge_exp.json", "number_out_of_range", 1),
    (
        "i_number_pos_double_huge_exp.json",
        "number_out_of_range",
        1,
    ),
    ("i_number_real_neg_overflow.json", "number_out_of_range", 1),
    ("i_number_real_pos_overflow.json", "number_out_of_range", 1),
    ("i_number_real_underflow.json", "number_out_of_range", 1),
    ("i_number_too_big_neg_int.json", "number_out_of_range", 1),
    ("i_number_too_big_pos_int.json", "number_out_of_range", 1),
    (
        "i_number_very_big_negative_int.json",
        "number_out_of_range",
        1,
    ),
    ("i_object_key_lone_2nd_surrogate.json", "lone_surrogate", 2),
    (
        "i_string_1st_surrogate_but_2nd_missing.json",
        "lone_surrogate",
        2,
    ),
    (
        "i_string_1st_valid_surrogate_2nd_invalid.json",
        "lone_surrogate",
        2,
    ),
    ("i_string_UTF-16LE_with_BOM.json", "invalid_utf8", 0),
    ("i_string_UTF-8_invalid_sequence.json", "invalid_utf8", 7),
    ("i_string_UTF8_surrogate_U+D800.json", "invalid_utf8", 2),
    (
        "i_string_incomplete_surrogate_and_escape_valid.json",
        "lone_surrogate",
        2,
    ),
    (
        "i_string_incomplete_surrogate_pair.json",
        "lone_surrogate",
        2,
    ),
    (
        "i_string_incomplete_surrogates_escape_valid.json",
        "lone_surrogate",
        2,
    ),
    (
        "i_string_invalid_lonely_surrogate.json",
        "lone_surrogate",
        2,
    ),
    ("i_string_invalid_surrogate.json", "lone_surrogate", 2),
    ("i_string_invalid_utf-8.json", "invalid_utf8", 2),
    (
        "i_string_inverted_surrogates_U+1D11E.json",
        "lone_surrogate",
        2,
    ),
    ("i_string_iso_latin_1.json", "invalid_utf8", 2),
    ("i_string_lone_second_surrogate.json", "lone_surrogate", 2),
    (
        "i_string_lone_utf8_continuation_byte.json",
        "invalid_utf8",
        2,
    ),
    ("i_string_not_in_unicode_range.json", "invalid_utf8", 2),
    ("i_string_overlong_sequence_2_bytes.json", "invalid_utf8", 2),
    ("i_string_overlong_sequence_6_bytes.json", "invalid_utf8", 2),
    (
        "i_string_overlong_sequence_6_bytes_null.json",
        "invalid_utf8",
        2,
    ),
    ("i_string_truncated-utf-8.json", "invalid_utf8", 2),
    ("i_string_utf16BE_no_BOM.json", "invalid_utf8", 5),
    ("i_string_utf16LE_no_BOM.json", "invalid_utf8", 4),
    ("i_structure_500_nested_arrays.json", "too_deep", 64),
    (
        "i_structure_UTF-8_BOM_empty_object.json",
        "byte_order_mark",
        0,
    ),
];

/// `y_` files the suite accepts but DESIGN §2.1 rejects on purpose.
const DUPLICATE_KEY_OVERRIDES: [(&str, usize, &str); 2] = [
    ("y_object_duplicated_key.json", 9, "/a"),
    ("y_object_duplicated_key_and_value.json", 9, "/a"),
];

/// Every regular file of `dir` by name, contents as bytes (several vectors
/// are deliberately not UTF-8).
fn read_dir_bytes(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            (name, fs::read(&path).unwrap())
        })
        .collect()
}

#[test]
fn json_test_suite() {
    let Some(suite) = suite_dir("JSONTestSuite") else {
        return;
    };
    let files = read_dir_bytes(&suite.join("test_parsing"));
    let limits = Limits::default();
    let expected_i: BTreeMap<&str, (&str, usize)> = IMPLEMENTATION_DEFINED
        .iter()
        .map(|&(name, reason, position)| (name, (reason, position)))
        .collect();
    let overrides: BTreeMap<&str, (usize, &str)> = DUPLICATE_KEY_OVERRIDES
        .iter()
        .map(|&(name, position, pointer)| (name, (position, pointer)))
        .collect();

    let mut failures = Vec::new();
    let mut seen = BTreeMap::<char, usize>::new();
    let mut seen_i = Vec::new();
    for (name, bytes) in &files {
        let kind = name.chars().next().unwrap();
        *seen.entry(kind).or_default() += 1;
        let outcome = parse_strict(bytes, &limits);
        let ok = match (kind, &outcome) {
            ('y', _) if overrides.contains_key(name.as_str()) => {
                let (position, pointer) = overrides[name.as_str()];
                outcome
                    == Err(DecodeError::DuplicateKey {
                        position,
                        pointer: pointer.to_owned(),
                    })
            }
            ('y', result) => result.is_ok(),
            ('n', result) => result.is_err(),
            ('i', result) => {
                seen_i.push(name.as_str());
                let got = result.as_ref().map_err(|e| (e.reason(), e.position()));
                let want = expected_i.get(name.as_str()).map(|&(r, p)| (r, Some(p)));
                want.is_some_and(|want| got == Err(want))
            }
            _ => panic!("unexpected file {name}"),
        };
        if !ok {
            failures.push(format!("{name}: {outcome:?}"));
        }
    }

    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let table: Vec<&str> = expected_i.keys().copied().collect();
    assert_eq!(seen_i, table, "the i_ table and the folder disagree");
    assert_eq!(
        seen,
        BTreeMap::from([('i', 35), ('n', 188), ('y', 95)]),
        "files seen per kind"
    );
}

/// The RFC 8785 inputs the decoder refuses for keys equal under case
/// folding, with the position and pointer of the first such key.
const FOLDED_DUPLICATES_OF_RFC8785: [(&str, usize, &str); 1] = [("structures.json", 26, "/1/f/F")];

#[test]
fn rfc8785_vectors() {
    let Some(suite) = suite_dir("json-canonicalization") else {
        return;
    };
    let inputs = read_dir_bytes(&suite.join("testdata/input"));
    let outputs = read_dir_bytes(&suite.join("testdata/output"));
    assert_eq!(
        inputs.keys().collect::<Vec<_>>(),
        outputs.keys().collect::<Vec<_>>(),
        "every input has an expected output"
    );
    let mut checked = 0;
    for (name, input) in &inputs {
        let value = match (
            parse_strict(input, &Limits::default()),
            FOLDED_DUPLICATES_OF_RFC8785
                .iter()
                .find(|(n, ..)| n == name),
        ) {
            (Ok(value), None) => value,
            // Keys that differ only in case (RFC 8785's sort-order vector
            // holds `"f"` beside `"F"`) are one key to case-insensitive
            // readers, so the decoder refuses them (DESIGN §2.1): that is
            // this vector's documented outcome. The canonical form is still
            // checked, on the value a plain parser reads.
            (Err(e), Some((_, position, pointer))) => {
                assert_eq!(
                    e,
                    DecodeError::DuplicateKey {
                        position: *position,
                        pointer: (*pointer).to_owned(),
                    },
                    "{name}"
                );
                serde_json::from_slice(input).unwrap()
            }
            (got, expected) => panic!("{name}: decoded as {got:?}, expected {expected:?}"),
        };
        let canonical = canonical_json(&value).unwrap();
        assert_eq!(
            canonical.as_bytes(),
            outputs[name].as_slice(),
            "{name}: canonical form differs"
        );
        checked += 1;
    }
    assert_eq!(checked, 6, "vectors checked");
}
