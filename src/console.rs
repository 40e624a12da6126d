//! Writing to the terminal without panicking: `std`'s `println!` and
//! `eprintln!` panic when the stream is a closed pipe (`| head -c 1`), so
//! the commands and the sidecar write through [`say!`](crate::say) and
//! [`Lines`] instead, and `main` opens `/dev/null` on a closed standard
//! descriptor ([`reopen_closed_stdio`]) before anything else can take it.
//!
//! The sidecar binary's internals: public for its integration tests only,
//! hidden from the documentation, not a stable API.

use std::io::Write;

/// Write one line to stderr; a closed or broken stderr is ignored.
pub fn err_line(args: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|_| err.write_all(b"\n"));
}

/// `eprintln!` that never panics: a closed or broken stderr is ignored.
#[macro_export]
#[doc(hidden)]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::console::err_line(format_args!($($arg)*))
    };
}

/// Lines written to an output that may close early (`| head -1`): each line
/// is written and flushed on its own; once a write fails, the rest are
/// dropped quietly. The exit code never depends on it: what was read or
/// done decides the code, the output is only its report.
pub struct Lines<'a> {
    out: &'a mut dyn Write,
    closed: bool,
}

impl<'a> Lines<'a> {
    /// Lines to `out`.
    pub fn new(out: &'a mut dyn Write) -> Self {
        Lines { out, closed: false }
    }

    /// Write each line of `text`; returns `false` once the output is closed.
    pub fn put(&mut self, text: &str) -> bool {
        for line in text.lines() {
            if self.closed {
                break;
            }
            let written = writeln!(self.out, "{line}").and_then(|_| self.out.flush());
            self.closed = written.is_err();
        }
        !self.closed
    }
}

/// Open `/dev/null` on each of the descriptors 0, 1 and 2 that is closed
/// (`2>&-`), so that no file or socket the process opens later becomes its
/// stdout or stderr (and receives its logs). Call first in `main`.
pub fn reopen_closed_stdio() {
    use std::os::fd::{AsRawFd, IntoRawFd};
    // `open` takes the lowest free descriptor: while it is one of 0-2, that
    // descriptor was closed and now points at /dev/null (kept open).
    for _ in 0..3 {
        let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        else {
            return;
        };
        if null.as_raw_fd() > 2 {
            return; // dropped: closed again
        }
        let _kept_open = null.into_raw_fd();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that accepts `n` writes, then fails as a closed pipe does.
    struct ClosesAfter(usize, Vec<u8>);

    impl Write for ClosesAfter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            self.0 -= 1;
            self.1.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_output_keeps_the_lines_written_and_drops_the_rest() {
        let mut out = ClosesAfter(2, Vec::new());
        let mut lines = Lines::new(&mut out);
        assert!(!lines.put("one\ntwo\nthree"));
        assert!(!lines.put("four"));
        assert_eq!(out.1, b"one\n");
        crate::say!("a line to stderr {}", 1);
    }
}
