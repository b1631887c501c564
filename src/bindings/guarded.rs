//! Native objects shared with Python threads, behind a lock.
//!
//! Python may reach one object from several threads, so a Python class must
//! be `Sync`; llama.cpp's contexts and sessions may move between threads but
//! must not be used by two at once. [`Guarded`] makes that so without any
//! `unsafe impl Sync`: methods that have the object exclusively (`&mut self`,
//! which PyO3's borrow checking guarantees) reach it without locking, and
//! shared reads take the lock.

use std::sync::{Mutex, MutexGuard};

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
}
