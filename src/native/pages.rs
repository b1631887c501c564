//! Large fresh buffers filled in one pass (sequence states, checkpoints):
//! backed by huge pages where the kernel offers them on request, so filling
//! one takes a page fault per 2 MiB instead of one per 4 KiB.

/// Buffers smaller than this are left to the allocator as they are.
const HINTED_BYTES: usize = 4 << 20;

/// The huge page size the hint aims at (x86-64 and aarch64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

/// Ask for huge pages under the whole 2 MiB pages of `len` bytes at `start`,
/// before they are first touched. Only a hint: the bytes are neither read nor
/// changed, and where the kernel has no transparent huge pages, or the range
/// is too small, nothing happens.
#[cfg(target_os = "linux")]
pub fn advise_huge_pages(start: *mut u8, len: usize) {
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize).saturating_add(len) & !(HUGE_PAGE - 1);
    if len < HINTED_BYTES || end <= first {
        return;
    }
    // SAFETY: `first..end` lies inside the caller's allocation and is page
    // aligned; MADV_HUGEPAGE changes how its pages are backed, never their
    // contents, and a failure (no THP in this kernel) leaves them as they were.
    unsafe {
        libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
    }
}

/// Elsewhere a no-op: see the Linux version.
#[cfg(not(target_os = "linux"))]
pub fn advise_huge_pages(_start: *mut u8, _len: usize) {}

/// A zeroed buffer of `len` bytes, huge pages advised before it is zeroed.
pub fn zeroed_buffer(len: usize) -> Vec<u8> {
    let mut buffer = Vec::with_capacity(len);
    advise_huge_pages(buffer.as_mut_ptr(), len);
    buffer.resize(len, 0);
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zeroed_buffer_is_zero_at_every_size() {
        for len in [0, 1, HINTED_BYTES - 1, HINTED_BYTES, 3 * HUGE_PAGE + 17] {
            let buffer = zeroed_buffer(len);
            assert_eq!(buffer.len(), len);
            assert!(buffer.iter().all(|&byte| byte == 0));
        }
    }

    #[test]
    fn the_hint_leaves_written_bytes_as_they_were() {
        let mut buffer: Vec<u8> = (0..5 * HUGE_PAGE).map(|i| (i % 251) as u8).collect();
        advise_huge_pages(buffer.as_mut_ptr(), buffer.len());
        assert!(buffer
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8));
    }
}
