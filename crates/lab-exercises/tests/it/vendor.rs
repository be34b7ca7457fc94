//! The copy of `idem` that the payments exercises' Rust projects build with (`vendor/idem`,
//! written by `lab exercise start`) is the crate the lab itself is built with: its sources are
//! embedded from `crates/idem/src`, and its standalone manifest must ask for the same
//! dependencies with the same features.

#[test]
fn the_vendored_manifest_has_idems_own_dependencies() {
    let own: toml::Table = toml::from_str(include_str!("../../../idem/Cargo.toml")).unwrap();
    let vendored: toml::Table =
        toml::from_str(include_str!("../../../../exercises/vendor/idem/Cargo.toml")).unwrap();
    assert_eq!(
        own["dependencies"], vendored["dependencies"],
        "exercises/vendor/idem/Cargo.toml's [dependencies] must be crates/idem's"
    );
    assert_eq!(vendored["package"]["name"].as_str(), Some("idem"));
}

#[test]
fn every_source_of_idem_is_embedded_under_vendor() {
    let embedded = lab_exercises::files::under("vendor/idem/src");
    for name in ["lib.rs", "coordinator.rs", "store.rs", "lua/reserve.lua"] {
        let (_, bytes) = embedded
            .iter()
            .find(|(path, _)| *path == name)
            .unwrap_or_else(|| panic!("vendor/idem/src/{name} is embedded"));
        let own =
            std::fs::read(format!("{}/../idem/src/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(*bytes, own.as_slice(), "{name} is idem's own");
    }
}
