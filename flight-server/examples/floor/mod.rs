//! What the floor examples (`copy_floor`, `tonic_floor`) share: their
//! runtime, and the one JSON line each process prints when it is done,
//! with its CPU time.

use anyhow::{Context, Result};

/// Two workers, as the pipeline's processes have on this kind of machine.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// Prints `{"role":..,"bytes":..,"seconds":..,"user_s":..,"sys_s":..}`,
/// the CPU times being this whole process's so far.
pub fn report(role: &str, bytes: u64, seconds: f64) -> Result<()> {
    let (user_s, sys_s) = cpu_times()?;
    println!(
        r#"{{"role":"{role}","bytes":{bytes},"seconds":{seconds:.6},"user_s":{user_s:.6},"sys_s":{sys_s:.6}}}"#
    );
    Ok(())
}

/// User and system CPU seconds of this process so far.
fn cpu_times() -> Result<(f64, f64)> {
    // SAFETY: getrusage only writes the rusage struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage(RUSAGE_SELF)");
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((seconds(usage.ru_utime), seconds(usage.ru_stime)))
}
