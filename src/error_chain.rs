//! One line for an error and its causes, for logs, audit records and answers to clients.

/// `err` and its sources, `: `-separated on one line; a source whose text the line ends
/// with already (a wrapper that repeats its cause) is not repeated.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("reading the config")]
        Read(#[source] std::io::Error),
        #[error("{0}")]
        Same(#[source] std::io::Error),
    }

    #[test]
    fn causes_follow_in_order_and_a_repeated_one_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(
            error_chain(&Outer::Read(io())),
            "reading the config: no such file"
        );
        assert_eq!(error_chain(&Outer::Same(io())), "no such file");
    }
}
