// Finds libferry: FERRY_LIB_DIR (a directory holding libferry.so) first, else the
// `pkg-config` program's `ferry` package, else the linker's default search path.
// Also tells the layout test where ferry.h is (FERRY_INCLUDE_DIR, pkg-config, or
// the source tree this crate sits in).
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config(flag: &str) -> Option<Vec<String>> {
    let out = Command::new("pkg-config").args([flag, "ferry"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.split_whitespace().map(str::to_owned).collect())
}

fn main() {
    for var in ["FERRY_LIB_DIR", "FERRY_INCLUDE_DIR", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");

    let mut include = env::var_os("FERRY_INCLUDE_DIR").map(PathBuf::from);
    if let Some(dir) = env::var_os("FERRY_LIB_DIR") {
        let dir = PathBuf::from(dir);
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:lib_dir={}", dir.display());
    } else if let Some(flags) = pkg_config("--libs-only-L") {
        for dir in flags.iter().filter_map(|f| f.strip_prefix("-L")) {
            println!("cargo:rustc-link-search=native={}", dir);
            println!("cargo:lib_dir={}", dir);
        }
        if include.is_none() {
            include = pkg_config("--cflags-only-I")
                .and_then(|f| f.iter().find_map(|f| f.strip_prefix("-I").map(PathBuf::from)));
        }
    }
    println!("cargo:rustc-link-lib=dylib=ferry");

    if include.is_none() {
        let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
        let tree = manifest.join("../../include");
        if tree.join("ferry/ferry.h").is_file() {
            include = Some(tree);
        }
    }
    if let Some(dir) = include {
        println!("cargo:rustc-env=FERRY_SYS_INCLUDE_DIR={}", dir.display());
        println!("cargo:rerun-if-changed={}", dir.join("ferry/ferry.h").display());
    }
}
