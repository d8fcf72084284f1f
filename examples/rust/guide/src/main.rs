//! docs/guide.md §9: ferry from Rust, start to end, on the sim. A crate of its
//! own (Cargo.toml, build.rs, src/main.rs) against an installed ferry (guide §9
//! says where pkg-config looks):
//!     PKG_CONFIG_PATH="$HOME/.local/lib/pkgconfig" cargo run
//! Exit status 0 when every check passed, 1 with the failing call's message.
use std::error::Error;
use std::process::ExitCode;

use ferry::{Allocation, Operand, Runtime};

const N: u64 = 64 * 1024;

fn run() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::builder().build()?; // the sim modelling an H200, verified uploads
    let a = rt.alloc(N, 0)?; // Allocation<'_>: borrows rt, Drop = stream-ordered free
    let b = rt.alloc(N, 0)?;
    let host: Vec<u8> = (0..N).map(|i| (i * 7) as u8).collect();
    rt.upload(0, &a, 0, &host)?; // verified

    // Hold stream 0 so the launch is still pending when `a` is freed: the launch
    // leases its operands, so the free is legal and `a` stays intact until it ran.
    let held = rt.hold(0)?;
    rt.launch(0, &[Operand::read(&a), Operand::write(&b)], |ctx| {
        // Your kernel: out = in + 1, byte by byte (255 wraps to 0). On the sim it
        // computes on the operands' bytes; on cuda you would launch your own kernel
        // on ctx.native_stream() over each operand's device address.
        let (input, output) = ctx.input_output(0, 1)?;
        for (o, i) in output.iter_mut().zip(input) {
            *o = i.wrapping_add(1);
        }
        Ok(()) // an Err, or a panic, is the op's error
    })?;
    let old = a.into_handle();
    rt.free(old)?;
    held.release()?;

    let mut got = vec![0u8; N as usize];
    rt.download(0, &b, 0, &mut got)?;
    for (i, (g, h)) in got.iter().zip(&host).enumerate() {
        if *g != h.wrapping_add(1) {
            return Err(format!("byte {} of b is {}, expected {}", i, g, h.wrapping_add(1)).into());
        }
    }
    println!("downloaded {} bytes of b, each one more than a's", N);

    match Allocation::from_handle(&rt, old) {
        Err(e @ ferry::Error::StaleHandle(_)) => println!("the freed handle is refused: {}", e),
        Err(e) => return Err(e.into()),
        Ok(_) => return Err("a freed handle was not refused".into()),
    }

    let stats = rt.pool_stats()?;
    println!(
        "allocs {}, frees {} (ferry's own buffers: internal_allocs {}, internal_frees {})",
        stats.allocs, stats.frees, stats.internal_allocs, stats.internal_frees
    );
    if (stats.allocs, stats.frees) != (2, 1) {
        return Err("expected 2 allocs and 1 free".into());
    }
    print!("{}", rt.memory_summary()?);
    b.free()?;
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("guide: ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("guide: {}", e);
            ExitCode::FAILURE
        }
    }
}
