//! Drop tests: object pool elements are dropped exactly once, whether handed out or free.

use std::cell::Cell;
use std::rc::Rc;

use bufpool::ObjectPool;

#[derive(Default)]
struct Counted(Option<Rc<Cell<usize>>>);

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.set(c.get() + 1);
        }
    }
}

#[test]
fn every_element_is_dropped_once() {
    let drops = Rc::new(Cell::new(0));
    {
        let pool = ObjectPool::new(6, |_, e: &mut Counted| e.0 = Some(Rc::clone(&drops))).unwrap();
        assert_eq!(pool.capacity(), 8);
        // Building them ran `T::default()` then init in place: no element was dropped yet.
        assert_eq!(drops.get(), 0);
        let a = pool.alloc().unwrap();
        let _b = pool.alloc().unwrap();
        pool.free(a).unwrap();
        assert_eq!(drops.get(), 0, "free must not drop the element");
    }
    assert_eq!(drops.get(), 8);
    assert_eq!(Rc::strong_count(&drops), 1, "no element leaked");
}

#[test]
fn a_panicking_init_leaks_nothing() {
    let drops = Rc::new(Cell::new(0));
    let d = Rc::clone(&drops);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        ObjectPool::new(4, |i, e: &mut Counted| {
            e.0 = Some(Rc::clone(&d));
            assert!(i < 2, "init fails at element {i}");
        })
    }));
    assert!(r.is_err());
    // Two elements got their counter before the panic, and all were dropped while unwinding.
    assert_eq!(drops.get(), 3);
    assert_eq!(Rc::strong_count(&drops), 1);
}
