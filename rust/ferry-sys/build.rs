// Finds libferry: FERRY_LIB_DIR (a directory holding libferry.so) first, else the
// `pkg-config` program's `ferry` package, else the linker's default search path.
// Also tells the layout test where ferry.h and its configured ferry/version.h are:
// FERRY_INCLUDE_DIR (a list of directories, as PATH), pkg-config, or the source
// tree this crate sits in plus the build tree's include/ beside FERRY_LIB_DIR.
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

    let mut include: Option<Vec<PathBuf>> = env::var_os("FERRY_INCLUDE_DIR").map(|v| env::split_paths(&v).collect());
    let lib_dir = env::var_os("FERRY_LIB_DIR").map(PathBuf::from);
    // The rpath reaches this crate's own tests only: cargo gives no dependent's
    // binary a dependency's link arguments, so a program using the crate adds the
    // rpath in a build script of its own (examples/rust/guide/build.rs, guide §9).
    if let Some(dir) = lib_dir.clone() {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        println!("cargo:lib_dir={}", dir.display());
    } else if let Some(flags) = pkg_config("--libs-only-L") {
        for dir in flags.iter().filter_map(|f| f.strip_prefix("-L")) {
            println!("cargo:rustc-link-search=native={}", dir);
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
            println!("cargo:lib_dir={}", dir);
        }
        if include.is_none() {
            include = pkg_config("--cflags-only-I")
                .and_then(|f| f.iter().find_map(|f| f.strip_prefix("-I").map(PathBuf::from)))
                .map(|dir| vec![dir]);
        }
    }
    println!("cargo:rustc-link-lib=dylib=ferry");

    if include.is_none() {
        let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
        let tree = manifest.join("../../include");
        if tree.join("ferry/ferry.h").is_file() {
            let mut dirs = vec![tree];
            // A build tree's library (build/<preset>/src) has its configured headers in ../include.
            if let Some(generated) = lib_dir.and_then(|d| d.parent().map(|p| p.join("include"))) {
                if generated.join("ferry/version.h").is_file() {
                    dirs.push(generated);
                }
            }
            include = Some(dirs);
        }
    }
    if let Some(dirs) = include {
        let joined = env::join_paths(&dirs).expect("include directories without the path separator");
        println!("cargo:rustc-env=FERRY_SYS_INCLUDE_DIR={}", joined.to_string_lossy());
        for dir in &dirs {
            for header in ["ferry/ferry.h", "ferry/version.h"] {
                if dir.join(header).is_file() {
                    println!("cargo:rerun-if-changed={}", dir.join(header).display());
                }
            }
        }
    }
}
