//! The output so far of an execution running as a task, in its `statusMessage`.
//!
//! The text arrives already redacted and tokenized (the progress forwarder's pieces), so
//! what `tasks/get` shows is what a progress notification would have carried.

use std::sync::Mutex;
use std::time::Instant;

use rmcp::task_manager::TaskContext;

/// Bytes of the latest output a status message carries.
pub const TAIL_BYTES: usize = 2048;

pub struct OutputTail {
    task: TaskContext,
    started: Instant,
    state: Mutex<TailState>,
}

#[derive(Default)]
struct TailState {
    tail: String,
    total: u64,
}

impl OutputTail {
    pub fn new(task: TaskContext) -> OutputTail {
        OutputTail {
            task,
            started: Instant::now(),
            state: Mutex::new(TailState::default()),
        }
    }

    /// Adds a piece of output and updates the task's status message.
    pub fn push(&self, piece: &str) {
        let message = {
            let mut s = self.state.lock().expect("output tail lock");
            s.total += piece.len() as u64;
            s.tail.push_str(piece);
            keep_last(&mut s.tail, TAIL_BYTES);
            status_message(self.started.elapsed().as_secs(), s.total, &s.tail)
        };
        self.task.set_status_message(message);
    }
}

/// Cuts `text` to its last `max` bytes at a character boundary, from a line start when
/// one is in the kept part.
fn keep_last(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut cut = text.len() - max;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    if let Some(nl) = text[cut..].find('\n') {
        if nl + 1 < text.len() - cut {
            cut += nl + 1;
        }
    }
    text.drain(..cut);
}

fn status_message(secs: u64, total: u64, tail: &str) -> String {
    if total as usize == tail.len() {
        format!("running for {secs} s; output so far:\n{tail}")
    } else {
        format!(
            "running for {secs} s; {total} bytes of output, the last {}:\n{tail}",
            tail.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_bounded_and_starts_at_a_line() {
        let mut t = String::new();
        for i in 0..1000 {
            t.push_str(&format!("line {i}\n"));
        }
        keep_last(&mut t, 100);
        assert!(t.len() <= 100);
        assert!(t.starts_with("line "), "{t:?}");
        assert!(t.ends_with("line 999\n"));
    }

    #[test]
    fn a_cut_inside_a_character_moves_to_its_end() {
        let mut t = "é".repeat(100);
        keep_last(&mut t, 51);
        assert!(t.len() <= 51 && t.chars().all(|c| c == 'é'));
    }

    #[test]
    fn one_long_line_is_kept_from_the_cut() {
        let mut t = "x".repeat(5000);
        keep_last(&mut t, TAIL_BYTES);
        assert_eq!(t.len(), TAIL_BYTES);
    }

    #[test]
    fn the_message_says_when_output_was_cut() {
        assert!(status_message(3, 5, "hello").contains("output so far:\nhello"));
        assert!(status_message(3, 9000, "tail").contains("9000 bytes of output, the last 4"));
    }
}
