//! Reused buffers for the bytes reads hand out.
//!
//! A read copies what it returns out of the I/O buffer (or joins cached chunks) into memory
//! of its own, which lives on in a Fetch response until the socket took it. A fresh
//! allocation of a megabyte is fresh pages from the kernel every time (the allocator hands
//! large blocks back between reads), and faulting them in cost more than the copy itself.
//! So large buffers go back to a per-thread free list when their bytes are dropped, bounded
//! in count and size.

use std::cell::RefCell;

use bytes::Bytes;

/// Copies smaller than this take an ordinary allocation.
const POOLED_MIN: usize = 64 << 10;
/// Buffers larger than this are not kept.
const POOLED_MAX: usize = 4 << 20;
/// Bytes of free buffers kept per thread (a Fetch of 16 partitions holds 16 MiB at once).
const FREE_BYTES_MAX: usize = 24 << 20;

thread_local! {
    /// Free buffers, and their capacities' sum.
    static FREE: RefCell<(Vec<Vec<u8>>, usize)> = const { RefCell::new((Vec::new(), 0)) };
}

/// A buffer that returns to this thread's free list when dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if buf.capacity() > POOLED_MAX {
            return;
        }
        // At thread exit the list may be gone already; the buffer is then freed.
        let _ = FREE.try_with(|free| {
            let (list, bytes) = &mut *free.borrow_mut();
            if *bytes + buf.capacity() <= FREE_BYTES_MAX {
                *bytes += buf.capacity();
                list.push(buf);
            }
        });
    }
}

/// The concatenation of `parts` (`len` bytes in all), in a pooled buffer when large.
pub fn concat(parts: &[&[u8]], len: usize) -> Bytes {
    debug_assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), len);
    if len < POOLED_MIN {
        return Bytes::from(parts.concat());
    }
    let mut buf = FREE
        .try_with(|free| take(&mut free.borrow_mut(), len))
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(len));
    buf.clear();
    for p in parts {
        buf.extend_from_slice(p);
    }
    Bytes::from_owner(Pooled(buf))
}

/// The free buffer that fits `len` bytes most closely, if one fits without wasting more
/// than half of itself.
fn take((list, bytes): &mut (Vec<Vec<u8>>, usize), len: usize) -> Option<Vec<u8>> {
    let fits = |b: &Vec<u8>| b.capacity() >= len && b.capacity() <= 2 * len;
    let (i, _) = list
        .iter()
        .enumerate()
        .filter(|(_, b)| fits(b))
        .min_by_key(|(_, b)| b.capacity())?;
    let buf = list.swap_remove(i);
    *bytes -= buf.capacity();
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
}
