//! Report 003 in Rust: a kernel bound to a transient buffer is queued and held on
//! the host (a lazily dispatched command), the buffer is freed, another stream
//! allocates something that fits only by reclaiming, then the queue is dispatched.
//! The held kernel's lease was taken at launch, so it reads the right bytes; the
//! freed buffer's old handle is an `Err`, never another block's memory.
//!
//!     cargo run --example report003
//!
//! Exit 0 when the kernel copied the right bytes, the big allocation was a
//! reclaim's recovery and the old handle was refused; 1 otherwise. Runs on sim.
use std::process::ExitCode;

use ferry::{Allocation, Error, Operand, Runtime};

const MIB: u64 = 1 << 20;

fn run() -> Result<bool, Error> {
    let rt = Runtime::builder().profile("tiny").capacity(8 * MIB).build()?;
    let _resident = rt.alloc(6 * MIB, 0)?;
    let transient = rt.alloc(MIB, 0)?;
    let out = rt.alloc(64 << 10, 0)?;
    let data: Vec<u8> = (0..MIB as usize).map(|i| ((i ^ (i >> 8)) & 0xFF) as u8).collect();
    rt.upload(0, &transient, 0, &data)?;

    let held = rt.hold(0)?; // 1. the command, bound to the transient, queued and held
    rt.launch(0, &[Operand::read(&transient).range(0, 64 << 10), Operand::write(&out)], |ctx| {
        let (src, dst) = ctx.input_output(0, 1)?;
        dst.copy_from_slice(&src[..dst.len()]);
        Ok(())
    })?;
    let old = transient.into_handle();
    rt.free(old)?; // 2. the buffer freed while the held command still reads it
    let before = rt.pool_stats()?;
    let big = rt.alloc(1536 << 10, 1)?; // 3. fits only by reclaiming
    rt.upload(1, &big, 0, &vec![7u8; 1536 << 10])?;
    held.release()?; // 4. dispatch

    let mut got = vec![0u8; 64 << 10];
    rt.download(0, &out, 0, &mut got)?;
    let stats = rt.pool_stats()?;
    let right = got[..] == data[..got.len()];
    let reclaimed = stats.reclaims > before.reclaims;
    println!(
        "report003: {} reclaim(s); the held command read {}",
        stats.reclaims,
        if right { "the right bytes" } else { "WRONG BYTES" }
    );
    let refused = match Allocation::from_handle(&rt, old) {
        Err(e @ Error::StaleHandle(_)) => {
            println!("report003: the freed buffer's handle: {}", e);
            true
        }
        Err(e) => {
            println!("report003: the freed buffer's handle: unexpected {}", e);
            false
        }
        Ok(a) => {
            println!("report003: the freed buffer's handle still names {} bytes", a.len());
            false
        }
    };
    rt.synchronize()?;
    Ok(right && reclaimed && refused)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("report003: {}", e);
            ExitCode::FAILURE
        }
    }
}
