//! One journal segment: a file of fixed size, mapped into memory and filled from the front.
//!
//! A line is appended by reserving its bytes with one atomic add and copying it into the
//! mapping. The mapping is the file's page cache, so the line is the kernel's as soon as it is
//! copied: a process killed right after loses none of it, exactly as with `write(2)`, without a
//! system call per line. (Each `write(2)` also updated the file's size and times under the
//! inode's lock, which on a busy gateway cost more than everything else the journal does.)
//!
//! The file's blocks are allocated when it is created (`fallocate`), so a full disk is an error
//! at creation, never a fault while a request writes. Bytes not yet written read as zeros: a
//! reader splits on newlines and zero bytes alike, so a line reserved by a process killed before
//! it copied anything is skipped, and a line cut short is an unreadable piece on its own.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

pub struct Segment {
    pub(super) path: PathBuf,
    map: MmapRaw,
    /// Bytes handed out so far; passes the mapping's length once a line did not fit.
    reserved: AtomicU64,
    opened: Instant,
    pub(super) retired: AtomicBool,
    /// Set when a line's holder went away without its event being committed (a settlement
    /// task dropped at exit): the file must then stay for the next start's replay.
    pub(super) keep: AtomicBool,
    pub(super) warned: AtomicBool,
    /// Bytes of the header line every segment opens with (`Journal`'s identity line).
    header: u64,
    /// Keeps the descriptor the mapping was made from (and `sync` uses) open.
    _file: File,
}

impl Segment {
    /// Creates `path` with `capacity` bytes allocated, maps it and copies `header` (a line
    /// naming whose segment it is) to its front.
    pub fn create(path: PathBuf, capacity: u64, header: &[u8]) -> Result<Segment, String> {
        let fail = |what: &str, e: std::io::Error| {
            format!("cannot {what} usage journal {}: {e}", path.display())
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| fail("create", e))?;
        if let Err(e) =
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, capacity)
        {
            // A file system without `fallocate` still gets a file of the right size; its
            // blocks are then allocated as lines arrive.
            if e != rustix::io::Errno::OPNOTSUPP {
                let _ = std::fs::remove_file(&path);
                return Err(fail("allocate", e.into()));
            }
            file.set_len(capacity).map_err(|e| fail("size", e))?;
        }
        let len =
            usize::try_from(capacity).map_err(|_| format!("segment too large: {capacity}"))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| fail("map", e))?;
        let segment = Segment {
            path,
            map,
            reserved: AtomicU64::new(0),
            opened: Instant::now(),
            retired: AtomicBool::new(false),
            keep: AtomicBool::new(false),
            warned: AtomicBool::new(false),
            header: header.len() as u64,
            _file: file,
        };
        if !segment.put(header) {
            let _ = std::fs::remove_file(&segment.path);
            return Err(format!(
                "usage journal {}: {capacity} bytes cannot hold its header",
                segment.path.display()
            ));
        }
        Ok(segment)
    }

    /// Copies `line` into the next free bytes; `false` when it does not fit (the segment is
    /// full and must be rotated).
    pub fn put(&self, line: &[u8]) -> bool {
        let len = line.len() as u64;
        let at = self.reserved.fetch_add(len, Ordering::Relaxed);
        if at.saturating_add(len) > self.capacity() {
            return false;
        }
        // `at..at + len` lies inside the mapping and was handed out to this call alone by the
        // `fetch_add` above; the mapping lives as long as `self`. `at` fits in usize because
        // the mapping's length is a usize.
        #[allow(clippy::cast_possible_truncation)]
        let at = at as usize;
        // SAFETY: see above: in bounds, not aliased by any other writer, and `line` is a
        // separate allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(line.as_ptr(), self.map.as_mut_ptr().add(at), line.len());
        }
        true
    }

    fn capacity(&self) -> u64 {
        self.map.len() as u64
    }

    /// Bytes holding lines (or reserved for lines being copied).
    pub fn used(&self) -> u64 {
        self.reserved.load(Ordering::Relaxed).min(self.capacity())
    }

    /// Whether any line besides the header was appended.
    pub fn has_lines(&self) -> bool {
        self.used() > self.header
    }

    pub fn age(&self) -> Duration {
        self.opened.elapsed()
    }

    /// Writes what was appended to the disk (against a machine crash; a killed process loses
    /// nothing without it).
    pub fn sync(&self) -> std::io::Result<()> {
        #[allow(clippy::cast_possible_truncation)]
        let used = self.used() as usize;
        if used == 0 {
            return Ok(());
        }
        self.map.flush_range(0, used)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) && !self.keep.load(Ordering::Acquire) {
            if let Err(e) = std::fs::remove_file(&self.path) {
                log::warn!("usage journal: cannot remove {}: {e}", self.path.display());
            }
        }
    }
}

/// The lines in a segment file's bytes: pieces between newlines and zero bytes (never part of
/// a JSON line), empty ones left out.
pub fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes
        .split(|b| *b == b'\n' || *b == 0)
        .filter(|piece| !piece.is_empty())
}

/// `base` with `.owner.tail` appended to its file name.
pub fn owned_path(base: &Path, owner: &str, tail: &str) -> PathBuf {
    let mut name = base.as_os_str().to_owned();
    name.push(format!(".{owner}.{tail}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_at_newlines_and_zero_bytes() {
        let bytes = b"{\"a\":1}\n\0\0\0{\"b\"\0\0{\"c\":3}\n\0\0";
        let got: Vec<&[u8]> = lines(bytes).collect();
        assert_eq!(got, vec![&b"{\"a\":1}"[..], b"{\"b\"", b"{\"c\":3}"]);
    }

    #[test]
    fn a_segment_takes_lines_until_full_and_keeps_them_in_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("seg");
        let seg = Segment::create(path.clone(), 20, b"h\n").expect("create");
        assert!(!seg.has_lines(), "the header is not a line");
        assert!(seg.put(b"0123456789\n"));
        assert!(seg.has_lines());
        assert!(!seg.put(b"too long\n"), "2 + 11 + 9 bytes exceed 20");
        assert_eq!(seg.used(), 20);
        seg.sync().expect("sync");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(bytes.len(), 20);
        assert_eq!(&bytes[..13], b"h\n0123456789\n");
        assert!(bytes[13..].iter().all(|b| *b == 0));
        // An existing file is never reused.
        assert!(Segment::create(path, 20, b"h\n").is_err());
        // Nor is a segment made that cannot hold its header.
        assert!(Segment::create(dir.path().join("small"), 1, b"h\n").is_err());
    }
}
