//! What Linux says about a process under `/proc`: memory, CPU time, open
//! files, and the machine's load. A value that cannot be read (the process
//! has exited, the field is missing) is 0, so a reading never panics.

/// A field `key` of the form `Key:  N kB` in `/proc/<pid>/<file>`, in KiB.
fn kib_field(pid: u32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of process `pid` (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    kib_field(pid, "status", "VmRSS:")
}

/// Proportional set size of process `pid` (`Pss` in `smaps_rollup`: shared
/// pages divided among their users), in KiB.
pub fn pss_kib(pid: u32) -> u64 {
    kib_field(pid, "smaps_rollup", "Pss:")
}

/// CPU time of process `pid` so far, user + system, in seconds (fields 14
/// and 15 of `/proc/<pid>/stat`, in ticks of 10 ms: `USER_HZ` is 100).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces; fields count from after it.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The machine's 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
