//! Native objects shared with Python threads, behind a lock.
//!
//! Python may reach one object from several threads, so a Python class must
//! be `Sync`; llama.cpp's contexts and sessions may move between threads but
//! must not be used by two at once. [`Guarded`] makes that so without any
//! `unsafe impl Sync`: methods that have the object exclusively (`&mut self`,
//! which PyO3's borrow checking guarantees) reach it without locking, and
//! shared reads take the lock.

use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::Python;

/// A value that shared references reach only through a lock.
pub(crate) struct Guarded<T>(Mutex<T>);

impl<T> Guarded<T> {
    /// Guard `value`.
    pub(crate) fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// The value, through an exclusive borrow (no locking needed).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
