//! A context's graph threads, kept between its graphs (`ggml_threadpool_new`).
//!
//! Without one, ggml's CPU backend creates its worker threads for every graph and joins them after it
//! (a "disposable" pool): one `pthread_create` and one join per worker per decode, and a fresh thread the
//! kernel has to place each time. `perf sched` of four generations on a shared engine counted one new,
//! short-lived thread per decode (724 tasks for 300 decodes). A kept pool's workers sleep between graphs
//! (`poll` 0: ggml's polling level counts in units of 131,072 `pause`s, milliseconds of a spinning core that
//! the threads handing out tokens need between decodes) and are woken by the next graph. Which thread runs
//! which rows does not change, so neither does a bit of any result.
//!
//! A process forked after a pool was made has none of its workers (a fork copies the calling thread only): a
//! graph would wait for them forever. So every graph first checks that the pool is this process's
//! ([`GraphPool::renew_after_fork`], in `fit_threads`, which every graph of a context or embedder goes through)
//! and, in a child, detaches the parent's (never freed there: freeing joins its threads) and attaches a new one.

use std::ptr::NonNull;

use llama_cpp_sys_4 as sys;

/// The worker threads of one context's graphs, freed after the context (its owner drops it last).
pub(crate) struct GraphPool {
    raw: NonNull<sys::ggml_threadpool>,
    /// Its threads, the caller's included.
    threads: i32,
    /// The process whose threads they are.
    pid: u32,
}

// SAFETY: the pool is used only by the graphs of the one context it is
// attached to, which runs one graph at a time; ggml's pool has no thread
// affinity (its workers wait on its own mutex and condition variable).
unsafe impl Send for GraphPool {}
// SAFETY: as for `Send`: a shared reference gives no access to the pool.
unsafe impl Sync for GraphPool {}

impl GraphPool {
    /// A pool of `threads` for `context`'s graphs, attached to it ([`GraphPool::new`]).
    ///
    /// # Safety
    /// `context` is live and freed before the pool.
    pub(crate) unsafe fn attached(
        threads: i32,
        context: NonNull<sys::llama_context>,
    ) -> Option<Self> {
        let pool = Self::new(threads)?;
        // SAFETY: live; freed before the pool (the caller's promise).
        unsafe { pool.attach(context) };
        Some(pool)
    }

    /// A pool of `threads` (the caller among them; `threads - 1` workers), or `None` for one thread, which
    /// needs no worker.
    fn new(threads: i32) -> Option<Self> {
        if threads <= 1 {
            return None;
        }
        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::ggml_threadpool_params_default(threads) };
        params.poll = 0;
        // SAFETY: `params` is a valid, initialised parameter struct whose
        // thread count is bounded by the caller (`check_threads`).
        let raw = NonNull::new(unsafe { sys::ggml_threadpool_new(&mut params) })?;
        Some(Self {
            raw,
            threads,
            pid: std::process::id(),
        })
    }

    /// Let `context`'s graphs run on this pool.
    ///
    /// # Safety
    /// `context` is live and freed before this pool.
    unsafe fn attach(&self, context: NonNull<sys::llama_context>) {
        // SAFETY: both live; the caller frees the context before the pool.
        unsafe {
            sys::llama_attach_threadpool(context.as_ptr(), self.raw.as_ptr(), self.raw.as_ptr())
        };
    }

    /// Before a graph of `context`: if `pool` was made by another process (this one is its fork), detach it
    /// and attach a new one of the same size.
    ///
    /// # Safety
    /// `context` is live, `pool` is attached to it, and nothing else uses the context during the call.
    pub(crate) unsafe fn renew_after_fork(
        pool: &mut Option<Self>,
        context: NonNull<sys::llama_context>,
    ) {
        let Some(threads) = pool
            .as_ref()
            .filter(|current| current.pid != std::process::id())
            .map(|stale| stale.threads)
        else {
            return;
        };
        // SAFETY: live and not in use (the caller's promise); detaching only
        // forgets the pool, which the context then no longer reads.
        unsafe { sys::llama_detach_threadpool(context.as_ptr()) };
        // The parent's workers are not in this process: freeing the pool
        // would wait for them to end. Its memory stays, as the fork left it.
        std::mem::forget(pool.take());
        // SAFETY: live; the caller frees the context before the pool.
        *pool = unsafe { Self::attached(threads, context) };
    }
}

impl Drop for GraphPool {
    fn drop(&mut self) {
        // SAFETY: created by `ggml_threadpool_new`, freed once; the context
        // that ran graphs on it is gone (the owner's promise, `attach`).
        unsafe { sys::ggml_threadpool_free(self.raw.as_ptr()) };
    }
}
