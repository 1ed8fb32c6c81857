//! Reused buffers for the bytes reads hand out.
//!
//! A read's bytes live on in a Fetch response until the socket took them: either the memory
//! a Direct I/O read landed in ([`crate::uring`]), or a copy out of the I/O buffer (or of
//! joined cached chunks). A fresh allocation of a megabyte is fresh pages from the kernel
//! every time (the allocator hands large blocks back between reads), and faulting them in
//! cost more than the copy itself. So large buffers go back to a free list when their bytes
//! are dropped, bounded in count and size: the list of the thread that took them, wherever
//! they are dropped (a Fetch reads on the shard that owns the partition and writes to the
//! socket on the connection's). Every buffer is page-aligned, so Direct I/O can read into
//! it.

#![allow(unsafe_code)] // the aligned allocation; each use says why it is sound

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

/// Copies smaller than this take an ordinary allocation.
const POOLED_MIN: usize = 64 << 10;
/// Pooled capacities are multiples of this, with a page to spare, so that reads of about the
/// same size (a megabyte, give or take the page an unaligned start adds) share buffers.
const POOLED_STEP: usize = 64 << 10;
/// One-page buffers (a batch header's read) kept per thread.
const PAGES_MAX: usize = 64;
/// Buffers larger than this are not kept.
const POOLED_MAX: usize = 4 << 20;
/// Bytes of free buffers kept per thread (a Fetch of 16 partitions holds 16 MiB at once).
const FREE_BYTES_MAX: usize = 24 << 20;
/// Every buffer starts on a page: what Direct I/O needs of memory it reads into.
pub const ALIGN: usize = 4096;

/// A thread's free buffers: shared with the threads that drop its buffers' bytes.
type Home = Arc<Mutex<Free>>;

#[derive(Default)]
struct Free {
    /// Free buffers of `POOLED_MIN..=POOLED_MAX` bytes, and their capacities' sum.
    list: Vec<AlignedBuf>,
    bytes: usize,
    /// Free one-page buffers.
    pages: Vec<AlignedBuf>,
}

thread_local! {
    static HOME: Home = Home::default();
}

/// `home`'s free buffers, locked (a thread that panicked holding them left them sound).
fn lock(home: &Home) -> MutexGuard<'_, Free> {
    home.lock().unwrap_or_else(|e| e.into_inner())
}

/// Page-aligned memory of a fixed capacity, of which the first `len` bytes are set.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: an `AlignedBuf` owns its allocation alone, as a `Vec<u8>` does; nothing else points
// into it (a read in flight into it holds it by value until the read completes).
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer that holds at least `capacity` bytes (whole pages).
    fn new(capacity: usize) -> AlignedBuf {
        let capacity = capacity.max(1).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(capacity, ALIGN).expect("a valid layout");
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout);
        };
        AlignedBuf {
            ptr,
            capacity,
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Where a read may put up to `capacity` bytes.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Takes the first `len` bytes as set.
    ///
    /// # Safety
    /// The first `len` bytes (at most `capacity`) must have been written.
    pub unsafe fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "{len} bytes in a buffer of {}",
            self.capacity
        );
        self.len = len;
    }

    fn extend_from_slice(&mut self, bytes: &[u8]) {
        assert!(
            self.len + bytes.len() <= self.capacity,
            "the buffer is too small"
        );
        // SAFETY: the destination is within the allocation (checked above) and cannot
        // overlap `bytes`, which no one can borrow from this buffer while it is borrowed
        // mutably here.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.len),
                bytes.len(),
            );
        }
        self.len += bytes.len();
    }

    /// Into the bytes it holds; the buffer goes back to this thread's free list with the
    /// last of them, wherever that is dropped.
    pub fn into_bytes(self) -> Bytes {
        match HOME.try_with(Arc::clone) {
            Ok(home) => Bytes::from_owner(Pooled {
                buf: Some(self),
                home,
            }),
            Err(_) => Bytes::from_owner(self),
        }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are set (`set_len`, `extend_from_slice`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.capacity, ALIGN).expect("as allocated");
        // SAFETY: allocated in `new` with this layout, and freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A buffer that returns to its home's free list when dropped.
struct Pooled {
    buf: Option<AlignedBuf>,
    home: Home,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_ref())
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else {
            return;
        };
        let free = &mut *lock(&self.home);
        if buf.capacity == ALIGN {
            if free.pages.len() < PAGES_MAX {
                free.pages.push(buf);
            }
        } else if (POOLED_MIN..=POOLED_MAX).contains(&buf.capacity) {
            // The oldest free buffers make room: sizes that stopped being asked for (a
            // burst of large reads) do not keep the list full for good.
            while free.bytes + buf.capacity > FREE_BYTES_MAX {
                let oldest = free.list.remove(0);
                free.bytes -= oldest.capacity;
            }
            free.bytes += buf.capacity;
            free.list.push(buf);
        }
    }
}

/// An empty aligned buffer for at least `len` bytes: a free one of this thread's when one
/// fits.
pub fn buffer(len: usize) -> AlignedBuf {
    let free = |len: usize| {
        // At thread exit the list may be gone already: a fresh buffer then.
        HOME.try_with(|home| {
            let free = &mut *lock(home);
            match len <= ALIGN {
                true => free.pages.pop(),
                false => take(free, len),
            }
        })
        .ok()
        .flatten()
    };
    let mut buf = match len <= ALIGN || len >= POOLED_MIN {
        true => free(len),
        false => None,
    }
    .unwrap_or_else(|| match len >= POOLED_MIN {
        true => AlignedBuf::new((len + ALIGN).next_multiple_of(POOLED_STEP)),
        false => AlignedBuf::new(len),
    });
    buf.len = 0;
    buf
}

/// The concatenation of `parts` (`len` bytes in all), in a pooled buffer when large.
pub fn concat(parts: &[&[u8]], len: usize) -> Bytes {
    debug_assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), len);
    if len < POOLED_MIN {
        return Bytes::from(parts.concat());
    }
    let mut buf = buffer(len);
    for p in parts {
        buf.extend_from_slice(p);
    }
    buf.into_bytes()
}

/// The free buffer that fits `len` bytes most closely, if one fits without wasting more
/// than half of itself.
fn take(free: &mut Free, len: usize) -> Option<AlignedBuf> {
    let fits = |b: &AlignedBuf| b.capacity >= len && b.capacity <= 2 * len;
    let (i, _) = free
        .list
        .iter()
        .enumerate()
        .filter(|(_, b)| fits(b))
        .min_by_key(|(_, b)| b.capacity)?;
    let buf = free.list.swap_remove(i);
    free.bytes -= buf.capacity;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_hold_what_was_copied() {
        let a = vec![1u8; POOLED_MIN];
        let b = vec![2u8; 100];
        let first = concat(&[&a, &b], a.len() + b.len());
        assert_eq!(&first[..POOLED_MIN], &a[..]);
        assert_eq!(&first[POOLED_MIN..], &b[..]);
        let ptr = first.as_ptr();
        drop(first);
        let second = concat(&[&b, &a], a.len() + b.len());
        assert_eq!(second.as_ptr(), ptr, "the freed buffer is taken again");
        assert_eq!(&second[..100], &b[..]);
        assert_eq!(&second[100..], &a[..]);
        let small = concat(&[&b], b.len());
        assert_eq!(&small[..], &b[..]);
        drop(second);
        // A buffer more than twice the size asked for is left for larger copies.
        let big = vec![3u8; 4 * POOLED_MIN];
        let big = concat(&[&big], big.len());
        let big_ptr = big.as_ptr();
        drop(big);
        let fitting = concat(&[&a], a.len());
        assert_ne!(fitting.as_ptr(), big_ptr);
    }

    #[test]
    fn the_oldest_free_buffers_make_room() {
        let big: Vec<Bytes> = (0..FREE_BYTES_MAX / POOLED_MAX)
            .map(|_| buffer(POOLED_MAX - POOLED_STEP).into_bytes())
            .collect();
        drop(big);
        // The list is full of buffers too large for a megabyte; the next ones still pool.
        let small = buffer(1 << 20).into_bytes();
        let ptr = small.as_ptr();
        drop(small);
        assert_eq!(buffer(1 << 20).as_ref().as_ptr(), ptr);
        HOME.with(|home| assert!(lock(home).bytes <= FREE_BYTES_MAX));
    }

    #[test]
    fn reads_of_about_the_same_size_share_buffers() {
        let a = buffer(1 << 20).into_bytes();
        let ptr = a.as_ptr();
        drop(a);
        let b = buffer((1 << 20) + ALIGN);
        assert_eq!(b.as_ref().as_ptr(), ptr, "a page more fits the same buffer");
        let page = buffer(61).into_bytes();
        let page_ptr = page.as_ptr();
        drop(page);
        assert_eq!(
            buffer(ALIGN).as_ref().as_ptr(),
            page_ptr,
            "pages are reused too"
        );
    }

    #[test]
    fn bytes_dropped_on_another_thread_return_their_buffer_home() {
        let bytes = buffer(1 << 20).into_bytes();
        let ptr = bytes.as_ptr();
        std::thread::spawn(move || drop(bytes)).join().unwrap();
        assert_eq!(buffer(1 << 20).as_ref().as_ptr(), ptr);
    }

    #[test]
    fn buffers_start_on_a_page() {
        for len in [1, 100, POOLED_MIN, POOLED_MAX + 1] {
            let mut buf = buffer(len);
            assert!(buf.capacity() >= len);
            assert_eq!(buf.as_mut_ptr() as usize % ALIGN, 0, "{len} bytes");
        }
    }
}
