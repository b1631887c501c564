//! Threads: the default count, [`threads_for`] over what [`Cpus::read`] finds of the machine, and the count a
//! graph runs with now, [`threads_now`] (docs/threads.md).
//!
//! The default: the physical cores among the CPUs this process may run on, at most its CPU quota, shared out
//! between the slots of the process that decode at once (at least 1 each). Hyper-threads are not counted: two
//! threads of one core share its vector units, and ggml's threads wait for each other at every operation of a
//! graph, so the slower of two siblings sets the pace. Every context and embedder asked for 0 threads, a
//! restore that keeps a checkpoint's count, the server's slots and the Ray workers take their count from
//! [`default_threads`].
//!
//! ggml's threads wait for each other at each of a graph's hundreds of barriers, so a thread the kernel
//! deschedules holds the others up, and a count the process cannot get collapses decoding. No way of waiting
//! saves two threads that cannot both run; running fewer does (docs/measured.md, "Threads beside busy
//! processes"). So each graph runs with at most the CPUs that the other runnable tasks leave free, read from the
//! kernel's count of runnable tasks just before it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::limits::MAX_THREADS;

/// What the rule reads of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpus {
    /// The CPUs this process may use: its affinity mask, capped by its cgroup CPU quota (rounded down, at
    /// least 1), as `std::thread::available_parallelism` reads them.
    pub usable: u32,
    /// The physical cores among the CPUs of the affinity mask (hyper-threads of one core counted once); 0
    /// where the topology cannot be read (outside Linux, or without `/sys`).
    pub physical_cores: u32,
}

impl Cpus {
    /// This process's CPUs, read now (the affinity mask can change while a process runs).
    pub fn read() -> Self {
        let usable = std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        Self {
            usable,
            physical_cores: physical_cores().unwrap_or(0),
        }
    }
}

/// The rule: threads for each of `slots` generations decoding at once in one process on `cpus`.
///
/// The physical cores (the usable CPUs where the cores are unknown), at most the usable CPUs, divided
/// between the slots (rounded down), at least 1 and at most [`MAX_THREADS`].
pub fn threads_for(cpus: Cpus, slots: u32) -> u32 {
    let usable = cpus.usable.max(1);
    let cores = match cpus.physical_cores {
        0 => usable,
        cores => cores.min(usable),
    };
    (cores / slots.max(1)).clamp(1, MAX_THREADS.unsigned_abs())
}

/// A thread count as asked (0: [`default_threads`] of one slot), resolved.
pub fn resolved(n_threads: i32) -> i32 {
    match n_threads {
        0 => default_threads(1),
        n_threads => n_threads,
    }
}

/// The default thread count of each of `slots` generations decoding at once in this process: the rule over
/// this machine, read now.
pub fn default_threads(slots: u32) -> i32 {
    i32::try_from(threads_for(Cpus::read(), slots)).unwrap_or(1)
}

/// The environment variable that keeps every graph at its configured thread count (`1`): for benchmarks
/// comparing with ggml's behaviour, and for machines whose cores a process owns.
pub const FIXED_THREADS_VARIABLE: &str = "SPECSTATE_FIXED_THREADS";

/// The other runnable tasks, smoothed over the last graphs, in 1/[`LOAD_ONE`]ths of a task: the process's
/// view of the machine (every context's graphs share it).
static LOAD: AtomicU32 = AtomicU32::new(0);
/// One task in [`LOAD`]'s fixed point.
const LOAD_ONE: u32 = 256;

/// The threads a graph of a context configured for `configured` threads runs with now: at most the online CPUs
/// that other runnable tasks leave free, at least 1 ([`fit`]); `configured` itself where the kernel's count
/// cannot be read, when it is 1 or less, or with [`FIXED_THREADS_VARIABLE`] set to `1`. Every kernel gives the
/// same bits at any thread count, so this changes speed only, never a token or a checkpoint.
pub fn threads_now(configured: i32) -> i32 {
    if configured <= 1 || fixed_threads() {
        return configured;
    }
    let Some(running) = runnable_tasks() else {
        return configured;
    };
    let others = match running.saturating_sub(1) {
        0 => 0,
        // Something else runs: other processes' tasks count, and this
        // process's other graphs, not its own passing threads (a server's
        // event loop, a slot handing out tokens), which soon wait again.
        // The own threads are read before the machine's count is read again:
        // one of them going to sleep in between (a round that just handed its
        // rows to a shared engine's decoder) then does not count as load.
        _ => {
            let own = own_runnable_threads().unwrap_or(1);
            let tasks = runnable_tasks().unwrap_or(running).saturating_sub(own);
            tasks
                .min(busy_others().unwrap_or(u32::MAX))
                .saturating_add(IN_FLIGHT.load(Ordering::Relaxed))
        }
    };
    let load = smoothed(LOAD.load(Ordering::Relaxed), others);
    LOAD.store(load, Ordering::Relaxed);
    fit(configured, online_cpus(), load)
}

/// The threads of this process's graphs running now (their callers included).
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);

/// A graph of this process running with some threads, counted by other graphs' [`threads_now`] while it lives.
#[must_use = "the graph counts while the guard lives"]
pub struct InFlight(u32);

impl InFlight {
    /// Count a graph that runs with `threads` threads until the guard is dropped.
    pub fn new(threads: i32) -> Self {
        let threads = threads.clamp(0, MAX_THREADS).unsigned_abs();
        IN_FLIGHT.fetch_add(threads, Ordering::Relaxed);
        Self(threads)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(self.0, Ordering::Relaxed);
    }
}

/// How long the CPU time of other processes is summed over before [`busy_others`] reads it again.
const SHARE_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// The CPU time counters at the start of the current window, and the last window's answer.
struct ShareWindow {
    started: std::time::Instant,
    counters: CpuCounters,
    busy_others: Option<u32>,
}

static WINDOW: std::sync::Mutex<Option<ShareWindow>> = std::sync::Mutex::new(None);

/// The whole tasks' worth of CPU time other processes used over the last [`SHARE_WINDOW`] (a task counts from
/// 0.6 of a CPU), or `None` before a window has passed or where the counters cannot be read. A task runnable at
/// the start of every graph but using a fifth of a CPU (a client parsing each streamed token) is no reason to
/// give a thread up; a busy process is.
fn busy_others() -> Option<u32> {
    let mut window = WINDOW.try_lock().ok()?;
    let now = std::time::Instant::now();
    match window.as_mut() {
        Some(open) if now.duration_since(open.started) < SHARE_WINDOW => open.busy_others,
        _ => {
            let counters = CpuCounters::read()?;
            let busy_others = window
                .as_ref()
                .and_then(|open| counters.others_since(&open.counters, online_cpus()));
            *window = Some(ShareWindow {
                started: now,
                counters,
                busy_others,
            });
            busy_others
        }
    }
}

/// The machine's CPU time counters and this process's (clock ticks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuCounters {
    /// Every CPU's time, idle included (`/proc/stat`'s `cpu` line).
    pub total: u64,
    /// Every CPU's busy time: user, nice, system, irq, softirq, steal.
    pub busy: u64,
    /// This process's user and system time (`/proc/self/stat`).
    pub own: u64,
}

impl CpuCounters {
    fn read() -> Option<Self> {
        let machine = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(machine.lines().next()?, &own)
    }

    /// The counters of `/proc/stat`'s first line and a `/proc/<pid>/stat` text.
    pub(crate) fn parse(cpu_line: &str, own_stat: &str) -> Option<Self> {
        let mut fields = cpu_line.split_ascii_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
            return None;
        };
        let busy = [user, nice, system, irq, softirq, steal]
            .iter()
            .try_fold(0_u64, |a, &b| a.checked_add(b))?;
        let total = busy.checked_add(idle)?.checked_add(iowait)?;
        // utime and stime: fields 14 and 15, the 12th and 13th after the name's closing parenthesis.
        let mut after_name = fields_after_name(own_stat)?.skip(11);
        let utime: u64 = after_name.next()?.parse().ok()?;
        let stime: u64 = after_name.next()?.parse().ok()?;
        Some(Self {
            total,
            busy,
            own: utime.checked_add(stime)?,
        })
    }

    /// Whole tasks of CPU time (from 0.6 of a CPU each) that others than this process used on `online` CPUs
    /// since `earlier`; `None` if no time passed.
    pub(crate) fn others_since(&self, earlier: &Self, online: u32) -> Option<u32> {
        let total = self.total.checked_sub(earlier.total).filter(|&t| t > 0)?;
        let others = self
            .busy
            .saturating_sub(earlier.busy)
            .saturating_sub(self.own.saturating_sub(earlier.own));
        // others / total of the machine's CPUs, in tenths of a CPU, plus 0.4 and rounded down.
        let tenths = others
            .saturating_mul(10)
            .saturating_mul(u64::from(online.max(1)))
            / total;
        u32::try_from((tenths + 4) / 10).ok()
    }
}

/// This process's runnable threads now, the calling one included (`R` in `/proc/self/task/*/stat`; at most the
/// first 4,096 threads read); `None` outside Linux.
fn own_runnable_threads() -> Option<u32> {
    let mut runnable = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()?.take(4096) {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("stat")) else {
            continue; // the thread has ended since the listing
        };
        runnable += u32::from(task_state(&stat) == Some('R'));
    }
    Some(runnable.max(1))
}

/// The state letter of a `/proc/<pid>/task/<tid>/stat` text.
pub(crate) fn task_state(stat: &str) -> Option<char> {
    fields_after_name(stat)?.next()?.chars().next()
}

/// The fields of a `/proc/<pid>/stat` text after the name (which may hold
/// spaces and parentheses: it ends at the last closing one), the state first.
fn fields_after_name(stat: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    Some(stat.rsplit_once(')')?.1.split_ascii_whitespace())
}

/// The threads of `configured` that `online` CPUs give beside a smoothed `load` of other tasks (a task counts
/// from three quarters of one): at least 1.
pub fn fit(configured: i32, online: u32, load: u32) -> i32 {
    let busy = load.saturating_add(LOAD_ONE / 4) / LOAD_ONE;
    let free = i32::try_from(online.saturating_sub(busy).max(1)).unwrap_or(i32::MAX);
    configured.min(free).max(1)
}

/// `load` after one more reading of `others` runnable tasks: half the new reading, half the old, so that a
/// machine must show a task at two graphs in a row before a thread is given up (a lone reading may be a
/// passing kernel thread: about one graph in 200 on an idle machine here), and a freed core is taken back at
/// the next graph.
pub fn smoothed(load: u32, others: u32) -> u32 {
    let reading = others
        .min(MAX_THREADS.unsigned_abs())
        .saturating_mul(LOAD_ONE);
    load / 2 + reading / 2
}

/// Whether [`FIXED_THREADS_VARIABLE`] is `1` (read once per process).
fn fixed_threads() -> bool {
    static FIXED: OnceLock<bool> = OnceLock::new();
    *FIXED.get_or_init(|| std::env::var(FIXED_THREADS_VARIABLE).is_ok_and(|value| value == "1"))
}

/// The tasks runnable on the machine now, this thread included: the fourth field of `/proc/loadavg`
/// (`running/total`); `None` outside Linux.
fn runnable_tasks() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    runnable_in_loadavg(&text)
}

/// The running count of a `/proc/loadavg` text.
pub(crate) fn runnable_in_loadavg(text: &str) -> Option<u32> {
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

/// The machine's online CPUs (`/sys/devices/system/cpu/online`, else the usable ones), read once: the tasks
/// of `/proc/loadavg` are the machine's, so they are weighed against its CPUs.
fn online_cpus() -> u32 {
    static ONLINE: OnceLock<u32> = OnceLock::new();
    *ONLINE.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|text| cpu_list(text.trim()))
            .and_then(|cpus| u32::try_from(cpus.len()).ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| Cpus::read().usable)
    })
}

/// The physical cores among the CPUs this thread may run on: the distinct sets of hardware threads that share
/// a core (`topology/core_cpus_list`, or `thread_siblings_list` on older kernels), or `None` if unreadable.
fn physical_cores() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()?;
    let allowed = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
    let mut cores = BTreeSet::new();
    for cpu in cpu_list(allowed.trim())? {
        let topology = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let siblings = std::fs::read_to_string(format!("{topology}/core_cpus_list"))
            .or_else(|_| std::fs::read_to_string(format!("{topology}/thread_siblings_list")))
            .ok()?;
        cores.insert(siblings.trim().to_owned());
    }
    u32::try_from(cores.len()).ok().filter(|&n| n > 0)
}

/// The CPUs of a kernel CPU list (`0-3,8,10-11`), or `None` if it is not one; at most 65,536 of them.
pub(crate) fn cpu_list(text: &str) -> Option<Vec<u32>> {
    const MOST: u32 = 1 << 16;
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|part| !part.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let cpu = part.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        if first > last || last >= MOST || cpus.len() + (last - first) as usize >= MOST as usize {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN_STAT: &str =
        "4242 (python3 (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 700 300 0 0 20 0 3 0";

    #[test]
    fn cpu_counters_read_the_machine_line_and_the_own_times() {
        let counters = CpuCounters::parse("cpu  100 5 50 800 20 3 2 1 0 0", OWN_STAT).unwrap();
        assert_eq!(
            counters,
            CpuCounters {
                total: 981,
                busy: 161,
                own: 1000
            }
        );
        assert!(CpuCounters::parse("cpu0 1 2 3 4 5 6 7 8", OWN_STAT).is_none());
        assert!(CpuCounters::parse("cpu 1 2 3", OWN_STAT).is_none());
        assert!(CpuCounters::parse("cpu  1 2 3 4 5 6 7 8", "garbage").is_none());
    }

    #[test]
    fn a_task_counts_from_six_tenths_of_a_cpu_of_other_processes() {
        let at = |total, busy, own| CpuCounters { total, busy, own };
        let start = at(1000, 100, 50);
        // 2 CPUs, 200 ticks of machine time: this process used 100, others 0, 20, 60, 100, 200.
        for (others, tasks) in [
            (0, 0),
            (20, 0),
            (59, 0),
            (60, 1),
            (100, 1),
            (159, 1),
            (200, 2),
        ] {
            let later = at(1200, 200 + others, 150);
            assert_eq!(later.others_since(&start, 2), Some(tasks), "{others}");
        }
        assert_eq!(start.others_since(&start, 2), None);
    }

    fn cpus(usable: u32, physical_cores: u32) -> Cpus {
        Cpus {
            usable,
            physical_cores,
        }
    }

    #[test]
    fn the_rule_counts_cores_within_the_quota_and_shares_them_out() {
        assert_eq!(threads_for(cpus(2, 2), 1), 2); // this workplace's 2-core machine
        assert_eq!(threads_for(cpus(8, 4), 1), 4); // 4 cores with hyper-threads
        assert_eq!(threads_for(cpus(2, 4), 1), 2); // a quota of 2 CPUs on 4 cores
        assert_eq!(threads_for(cpus(6, 0), 1), 6); // cores unknown: the usable CPUs
        assert_eq!(threads_for(cpus(16, 8), 2), 4); // two slots
        assert_eq!(threads_for(cpus(16, 8), 3), 2); // rounded down
        assert_eq!(threads_for(cpus(2, 2), 4), 1); // at least one each
        assert_eq!(threads_for(cpus(0, 0), 0), 1);
        assert_eq!(threads_for(cpus(4096, 2048), 1), 512); // ggml's limit
    }

    #[test]
    fn this_machine_gets_at_least_one_thread_and_no_more_than_it_has() {
        let machine = Cpus::read();
        let threads = default_threads(1);
        assert!(threads >= 1);
        assert!(threads.unsigned_abs() <= machine.usable.max(1));
        assert!(default_threads(u32::MAX) == 1);
    }

    #[test]
    fn graphs_run_with_the_cpus_other_tasks_leave() {
        let one = LOAD_ONE;
        assert_eq!(fit(2, 2, 0), 2); // idle
        assert_eq!(fit(2, 2, one), 1); // one busy process on 2 cores
        assert_eq!(fit(2, 2, 5 * one), 1); // at least one
        assert_eq!(fit(8, 16, 3 * one), 8); // the cores left are enough
        assert_eq!(fit(16, 16, 3 * one), 13);
        assert_eq!(fit(2, 2, one * 3 / 4 - 1), 2); // under three quarters of a task: none
        assert_eq!(fit(2, 2, one * 3 / 4), 1);
        assert_eq!(fit(1, 2, 0), 1);
    }

    #[test]
    fn a_passing_task_is_smoothed_away_and_a_lasting_one_is_not() {
        let after = |readings: &[u32]| {
            readings
                .iter()
                .fold(0, |load, &others| smoothed(load, others))
        };
        assert_eq!(fit(2, 2, after(&[1])), 2);
        assert_eq!(fit(2, 2, after(&[1, 0, 1, 0, 1])), 2);
        assert_eq!(fit(2, 2, after(&[1, 1])), 1);
        assert_eq!(fit(2, 2, after(&[1; 50])), 1);
        let freed: Vec<u32> = [1; 50].iter().chain(&[0]).copied().collect();
        assert_eq!(fit(2, 2, after(&freed)), 2);
        assert_eq!(fit(4, 4, after(&[2, 2, 2])), 2);
        assert!(after(&[u32::MAX; 100]) <= MAX_THREADS.unsigned_abs() * LOAD_ONE);
    }

    #[test]
    fn a_threads_state_is_read_after_its_name() {
        assert_eq!(task_state("12 (python3) R 1 12 12"), Some('R'));
        assert_eq!(task_state("12 (a) b) S 1"), Some('S'));
        assert_eq!(task_state("12 (x"), None);
        assert!(own_runnable_threads().is_some_and(|n| n >= 1));
        let before = IN_FLIGHT.load(Ordering::Relaxed);
        {
            let _graph = InFlight::new(3);
            assert!(IN_FLIGHT.load(Ordering::Relaxed) >= before + 3);
        }
    }

    #[test]
    fn the_running_count_is_read_from_loadavg() {
        assert_eq!(runnable_in_loadavg("0.00 0.03 0.83 1/79 30762\n"), Some(1));
        assert_eq!(runnable_in_loadavg("1.5 1 1 12/3000 7"), Some(12));
        assert_eq!(runnable_in_loadavg("0.00 0.03 0.83"), None);
        assert_eq!(runnable_in_loadavg("a b c x/y z"), None);
        let threads = threads_now(2);
        assert!((1..=2).contains(&threads));
        assert_eq!(threads_now(1), 1);
    }

    #[test]
    fn kernel_cpu_lists_are_read() {
        assert_eq!(cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("5"), Some(vec![5]));
        assert_eq!(cpu_list(""), Some(vec![]));
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("a"), None);
        assert_eq!(cpu_list("0-4294967295"), None);
    }
}
