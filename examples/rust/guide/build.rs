// The rpath that `pkg-config --libs ferry` gives a C program, so this program
// finds the installed libferry.so without LD_LIBRARY_PATH. ferry-sys's build
// script cannot add it: cargo applies a dependency's link arguments to that
// dependency's own tests and examples only, never to the binary that uses it.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    // No pkg-config, or no ferry.pc on its path: ferry-sys links from the linker's
    // default path (a /usr install), which the loader searches too.
    if let Ok(out) = Command::new("pkg-config").args(["--variable=libdir", "ferry"]).output() {
        let dir = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && !dir.trim().is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.trim());
        }
    }
}
