//! Native objects shared with Python threads, behind a lock.
//!
//! Python may reach one object from several threads, so a Python class must
//! be `Sync`; llama.cpp's contexts and sessions may move between threads but
//! must not be used by two at once. [`Guarded`] makes that so without any
//! `unsafe impl Sync`. The classes holding one are frozen (no PyO3 borrow
//! flag, so another thread never meets an untyped borrow error): a call
//! that runs natively takes the lock with the GIL released
//! (`py.detach(|| work(&mut guarded.lock()))`), and a call that holds the
//! GIL takes it with [`Guarded::lock_waiting`], which releases the GIL while
//! it waits, so two threads never wait on each other's lock and GIL.

use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::Python;

/// A value that shared references reach only through a lock.
pub(crate) struct Guarded<T>(Mutex<T>);

impl<T> Guarded<T> {
    /// Guard `value`.
    pub(crate) fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// The value, locked for the guard's lifetime.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The value, locked for the guard's lifetime, waiting with the GIL
    /// released while another thread holds it (a getter called while the
    /// owner's call runs natively waits for that call instead of failing).
    pub(crate) fn lock_waiting(&self, py: Python<'_>) -> MutexGuard<'_, T>
    where
        T: Send,
    {
        loop {
            match self.0.try_lock() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => py.detach(|| drop(self.lock())),
            }
        }
    }
}
