//! The nginx module: filled in by the nginx-module issue.
