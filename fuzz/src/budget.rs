//! Memory bounds: a counting global allocator, and the peak a closure reached.
//!
//! Every target asserts that parsing an input of `n` bytes never holds more than a fixed
//! multiple of `n` (plus a constant) at once: an input that makes a parser allocate
//! without bound is a finding, not only one that makes it panic.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use mimalloc::MiMalloc;

/// mimalloc, counting the bytes live and their peak. Not glibc's allocator: the targets
/// allocate on every token they render or parse, and glibc's `malloc`/`free` took a
/// quarter of a `codegen` execution (perf under AFL++).
pub struct Counting;

/// What [`Counting`] forwards to.
static INNER: MiMalloc = MiMalloc;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(by: usize) {
    LIVE.fetch_sub(by, Ordering::Relaxed);
}

// SAFETY: every method forwards to `INNER` with the caller's arguments unchanged, so
// its guarantees hold; the counters are only bookkeeping beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract (non-zero size), passed on as is.
        let p = unsafe { INNER.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { INNER.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `INNER`) with `layout`.
        unsafe { INNER.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `realloc`'s contract, passed on as is.
        let p = unsafe { INNER.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`; returns its result and the most bytes it held at once beyond what was live
/// before (allocations of other threads count too: the targets run on one thread).
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    (out, peak)
}

/// Panics when `peak` exceeds `per_byte * input + fixed`.
#[track_caller]
pub fn assert_within(what: &str, peak: usize, input: usize, per_byte: usize, fixed: usize) {
    let bound = input.saturating_mul(per_byte).saturating_add(fixed);
    assert!(
        peak <= bound,
        "{what}: {peak} bytes held at once for {input} bytes of input (bound {bound} = {per_byte} x input + {fixed})"
    );
}
