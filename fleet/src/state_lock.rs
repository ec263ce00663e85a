//! Whether another process holds a state directory's lock.
//!
//! RocksDB takes a POSIX record lock on `<dir>/LOCK` for as long as it has
//! the database open. A standby that won the lease asks here before it
//! opens the state, so it can say what it waits for instead of failing.
//! On shared filesystems this relies on coherent POSIX locks across
//! clients (Lustre mounted with `flock`, GPFS, NFSv4).

use std::os::fd::AsRawFd;
use std::path::Path;

/// The pid holding a write lock on `<dir>/LOCK` (as the filesystem reports
/// it: on a shared filesystem, a pid on another host), if any.
pub fn lock_holder(dir: &Path) -> std::io::Result<Option<i32>> {
    let path = dir.join("LOCK");
    let file = match std::fs::OpenOptions::new().read(true).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: a zeroed flock is a valid argument; F_GETLK only writes it.
    let mut probe: libc::flock = unsafe { std::mem::zeroed() };
    probe.l_type = libc::F_WRLCK as libc::c_short;
    probe.l_whence = libc::SEEK_SET as libc::c_short;
    probe.l_start = 0;
    probe.l_len = 0;
    // SAFETY: a valid descriptor and a valid, initialised flock.
    let result = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut probe) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((probe.l_type != libc::F_UNLCK as libc::c_short).then_some(probe.l_pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_by_another_process_is_seen() {
        let dir = std::env::temp_dir().join(format!("fleet-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(lock_holder(&dir).unwrap(), None);
        std::fs::write(dir.join("LOCK"), b"").unwrap();
        assert_eq!(lock_holder(&dir).unwrap(), None);
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(
                "import fcntl,sys,time\nf=open(sys.argv[1],'r+')\nfcntl.lockf(f,fcntl.LOCK_EX)\nprint('locked',flush=True)\ntime.sleep(30)",
            )
            .arg(dir.join("LOCK"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "locked");
        assert_eq!(lock_holder(&dir).unwrap(), Some(child.id() as i32));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(lock_holder(&dir).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
