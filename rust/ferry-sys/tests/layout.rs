// The Rust declarations against include/ferry/ferry.h: every struct the header
// defines, its fields by name, its size and each field's offset as a C compiler
// lays them out, and every function it exports. A field added to the header
// fails here until the Rust struct has it too.
use std::collections::BTreeMap;
use std::mem::{size_of, MaybeUninit};
use std::path::PathBuf;
use std::process::Command;

use ferry_sys::*;

macro_rules! offset_of {
    ($t:ty, $field:ident) => {{
        let value = MaybeUninit::<$t>::uninit();
        let base = value.as_ptr();
        // Only the address is taken: nothing uninitialized is read.
        let field = unsafe { std::ptr::addr_of!((*base).$field) };
        field as usize - base as usize
    }};
}

macro_rules! layouts {
    ($($t:ident { $($field:ident),* $(,)? })*) => {{
        let mut all: BTreeMap<String, (usize, BTreeMap<String, usize>)> = BTreeMap::new();
        $(
            let mut fields = BTreeMap::new();
            $( fields.insert(stringify!($field).to_string(), offset_of!($t, $field)); )*
            all.insert(stringify!($t).to_string(), (size_of::<$t>(), fields));
        )*
        all
    }};
}

fn rust_layouts() -> BTreeMap<String, (usize, BTreeMap<String, usize>)> {
    layouts! {
        ferry_handle { pool, slot, generation }
        ferry_runtime_options { struct_size, backend, profile, capacity, seed, integrity, inject, cache_slots,
                                cache_slot_bytes, race_check, device_count, links }
        ferry_operand { handle, offset, bytes, access }
        ferry_launch_context { native_stream, operand_count, device_addresses, bytes, host_views }
        ferry_pool_stats { struct_size, allocated_bytes, peak_allocated_bytes, reserved_bytes, peak_reserved_bytes,
                           pending_free_bytes, allocs, frees, ooms, reclaims, internal_allocs, internal_frees }
        ferry_integrity_stats { struct_size, bytes_moved, bytes_verified, mismatches, retries, fallbacks }
        ferry_race_side { stream, ticket, kind, tag, access, block, block_tag }
        ferry_race { earlier, later, addr, bytes, reuse, earlier_device, later_device }
        ferry_cache_stats { struct_size, hits, misses, evictions, uploads, bytes_uploaded, prefetches }
        ferry_multi_cache_stats { struct_size, peer_fills, host_fills, bytes_peer }
    }
}

// The directories holding ferry/ferry.h and its configured ferry/version.h.
fn header_dirs() -> Vec<PathBuf> {
    match option_env!("FERRY_SYS_INCLUDE_DIR") {
        Some(dirs) => std::env::split_paths(dirs).collect(),
        None => panic!("ferry-sys's build found no ferry/ferry.h: set FERRY_INCLUDE_DIR (or install ferry's pkg-config file)"),
    }
}

fn header_file(name: &str) -> PathBuf {
    let dirs = header_dirs();
    let found = dirs.iter().map(|d| d.join("ferry").join(name)).find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("no ferry/{} in {:?}: set FERRY_INCLUDE_DIR", name, dirs))
}

fn header_text() -> String {
    let path = header_file("ferry.h");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {}", path.display(), e));
    strip_comments(&text)
}

fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find("*/") {
            Some(end) => &rest[start + end + 2..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

// `typedef struct NAME { fields } NAME;` -> NAME and its field names in order.
fn header_structs(text: &str) -> Vec<(String, Vec<String>)> {
    let mut structs = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("typedef struct ") {
        rest = &rest[at + "typedef struct ".len()..];
        let open = match (rest.find('{'), rest.find(';')) {
            (Some(open), Some(semi)) if open < semi => open,
            _ => continue, // an opaque typedef (ferry_runtime)
        };
        let name = rest[..open].trim().to_string();
        let close = rest.find('}').expect("a struct body closes");
        let mut fields = Vec::new();
        for decl in rest[open + 1..close].split(';').map(str::trim).filter(|d| !d.is_empty()) {
            for (i, part) in decl.split(',').enumerate() {
                let part = part.trim();
                let ident = if i == 0 { part.rsplit([' ', '*']).next().unwrap() } else { part };
                fields.push(ident.trim_start_matches('*').trim().to_string());
            }
        }
        structs.push((name, fields));
        rest = &rest[close..];
    }
    structs
}

fn c_layouts(structs: &[(String, Vec<String>)]) -> BTreeMap<String, (usize, BTreeMap<String, usize>)> {
    let mut program = String::from("#include <stddef.h>\n#include <stdio.h>\n#include <ferry/ferry.h>\nint main(void) {\n");
    program.push_str("  printf(\"ferry_status %zu\\n\", sizeof(ferry_status));\n");
    for (name, fields) in structs {
        program.push_str(&format!("  printf(\"{0} %zu\\n\", sizeof({0}));\n", name));
        for f in fields {
            program.push_str(&format!("  printf(\"{0}.{1} %zu\\n\", offsetof({0}, {1}));\n", name, f));
        }
    }
    program.push_str("  return 0;\n}\n");

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ferry-sys-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    let binary = dir.join("layout");
    std::fs::write(&source, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut command = Command::new(&cc);
    command.arg("-std=c11");
    for dir in header_dirs() {
        command.arg("-I").arg(dir);
    }
    let built = command
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{}` (set CC): {}", cc, e));
    assert!(built.success(), "{} could not compile {}", cc, source.display());
    let out = Command::new(&binary).output().unwrap();
    assert!(out.status.success());

    let mut all: BTreeMap<String, (usize, BTreeMap<String, usize>)> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let (key, value) = line.split_once(' ').unwrap();
        let value: usize = value.parse().unwrap();
        match key.split_once('.') {
            Some((s, f)) => {
                all.get_mut(s).unwrap().1.insert(f.to_string(), value);
            }
            None => {
                all.insert(key.to_string(), (value, BTreeMap::new()));
            }
        }
    }
    all
}

#[test]
fn every_struct_matches_the_header() {
    let structs = header_structs(&header_text());
    assert!(structs.len() >= 9, "found only {:?} in ferry.h", structs);
    let mut c = c_layouts(&structs);
    let (status_size, _) = c.remove("ferry_status").unwrap();
    assert_eq!(status_size, size_of::<ferry_status>(), "sizeof(ferry_status)");
    let rust = rust_layouts();

    let mut drift = Vec::new();
    for (name, (size, fields)) in &c {
        let (rsize, rfields) = match rust.get(name) {
            Some(r) => r,
            None => {
                drift.push(format!("ferry.h defines struct {} that ferry-sys does not declare", name));
                continue;
            }
        };
        if size != rsize {
            drift.push(format!("sizeof({}): C {} bytes, Rust {}", name, size, rsize));
        }
        for (field, offset) in fields {
            match rfields.get(field) {
                None => drift.push(format!("ferry.h's {} has field `{}` that the Rust struct lacks", name, field)),
                Some(r) if r != offset => {
                    drift.push(format!("offsetof({}, {}): C {}, Rust {}", name, field, offset, r))
                }
                Some(_) => {}
            }
        }
        for field in rfields.keys().filter(|f| !fields.contains_key(*f)) {
            drift.push(format!("the Rust {} has field `{}` that ferry.h's lacks", name, field));
        }
    }
    for name in rust.keys().filter(|n| !c.contains_key(*n)) {
        drift.push(format!("ferry-sys declares {} that ferry.h no longer defines", name));
    }
    assert!(drift.is_empty(), "ferry-sys has drifted from include/ferry/ferry.h:\n  {}", drift.join("\n  "));
}

#[test]
fn every_function_of_the_header_is_declared() {
    let text = header_text();
    let declared = include_str!("../src/lib.rs");
    let mut missing = Vec::new();
    let mut count = 0;
    for decl in text.split("FERRY_C_API ").skip(2) {
        let name = decl[..decl.find('(').unwrap()].rsplit([' ', '*']).next().unwrap();
        count += 1;
        if !declared.contains(&format!("pub fn {}(", name)) {
            missing.push(name.to_string());
        }
    }
    assert!(count >= 30, "found only {} functions in ferry.h", count);
    assert!(missing.is_empty(), "ferry.h exports functions ferry-sys does not declare: {:?}", missing);
}

#[test]
fn statuses_have_their_names() {
    let name = |s| unsafe { std::ffi::CStr::from_ptr(ferry_status_name(s)) }.to_str().unwrap().to_string();
    assert_eq!(name(FERRY_OK), "ok");
    assert_eq!(name(FERRY_ERROR_STALE_HANDLE), "stale_handle");
    assert_eq!(name(FERRY_ERROR_TIMEOUT), "timeout");
}

#[test]
fn the_librarys_struct_sizes_match_these_declarations() {
    assert_eq!(check_struct_sizes(), Ok(()));
    let names: Vec<&str> = struct_sizes().iter().map(|&(n, _)| n).collect();
    let mut in_header: Vec<String> = header_structs(&header_text()).into_iter().map(|(n, _)| n).collect();
    in_header.sort();
    let mut declared: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    declared.sort();
    assert_eq!(declared, in_header, "struct_sizes() lists every struct of ferry.h");
}

#[test]
fn a_declaration_of_the_wrong_size_is_refused() {
    let size = std::mem::size_of::<ferry_pool_stats>();
    let err = check_struct_size("ferry_pool_stats", size - 8).unwrap_err();
    assert!(err.contains(&format!("ferry_pool_stats in {} bytes, ferry-sys", size)), "{}", err);
    assert!(err.contains("different versions of ferry.h"), "{}", err);
    assert!(check_struct_size("ferry_no_such_struct", 8).unwrap_err().contains("in 0 bytes"));
}

// One version: the header's macros (configured from CMakeLists.txt's project(VERSION)),
// the library's ferry_version(), ferry-sys's constants and this crate's Cargo version.
#[test]
fn every_version_is_the_one_from_cmake() {
    let text = std::fs::read_to_string(header_file("version.h")).unwrap();
    let macro_value = |name: &str| -> String {
        let line = text.lines().find(|l| l.starts_with(&format!("#define {} ", name))).unwrap();
        line.split_whitespace().nth(2).unwrap().trim_matches('"').to_string()
    };
    let header = macro_value("FERRY_VERSION_STRING");
    let parts = format!("{}.{}.{}", macro_value("FERRY_VERSION_MAJOR"), macro_value("FERRY_VERSION_MINOR"),
                        macro_value("FERRY_VERSION_PATCH"));
    assert_eq!(parts, header);
    let sys_constants = format!("{}.{}.{}", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
    assert_eq!(sys_constants, header, "ferry-sys's FERRY_VERSION_* against ferry/version.h");
    assert_eq!(env!("CARGO_PKG_VERSION"), header, "rust/ferry-sys/Cargo.toml's version against CMakeLists.txt's");
    let library = unsafe { std::ffi::CStr::from_ptr(ferry_version()) }.to_str().unwrap().to_string();
    assert_eq!(library, header, "the loaded library's ferry_version()");
    if let Some(cmake) = option_env!("FERRY_PROJECT_VERSION") {
        assert_eq!(header, cmake, "ferry/version.h against CMakeLists.txt's project(VERSION)");
    }
}
