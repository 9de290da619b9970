//! Lock access that outlives a panic: a task that panicked while holding a lock must not take
//! every later reader down with it. The data behind these locks is replaced whole or is a cache,
//! so a half-finished update is never left visible, and the guard is taken as is.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub trait LockExt<T: ?Sized> {
    /// `lock()`, recovering the guard from a poisoned mutex.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub trait RwLockExt<T: ?Sized> {
    /// `read()`, recovering the guard from a poisoned lock.
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    /// `write()`, recovering the guard from a poisoned lock.
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_hands_out_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock_unpoisoned(), 1);
        let r = std::sync::Arc::new(RwLock::new(2));
        let r2 = r.clone();
        let _ = std::thread::spawn(move || {
            let _g = r2.write().unwrap();
            panic!("poison it");
        })
        .join();
        *r.write_unpoisoned() += 1;
        assert_eq!(*r.read_unpoisoned(), 3);
    }
}
