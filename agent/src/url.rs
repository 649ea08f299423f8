//! Root URLs as the HTTP client can use them.
//!
//! The same rules as the nginx module's `yarl_roots` (checked at `nginx -t` there): a URL
//! the client cannot call must fail when the limiter is configured, not at every sync.

/// Checks one root URL and returns it without a trailing slash (the transport appends
/// `/v1/sync`). `http://` and `https://` (verified against the system's trust store or
/// [`HttpOptions::ca_file`](crate::HttpOptions::ca_file)) are accepted; credentials, a
/// query or a fragment are not. The error says what is wrong.
///
/// ```
/// use yarl_agent::parse_root_url;
///
/// assert_eq!(parse_root_url("http://127.0.0.1:7700/").unwrap(), "http://127.0.0.1:7700");
/// assert!(parse_root_url("127.0.0.1:7700").is_err());
/// ```
pub fn parse_root_url(s: &str) -> Result<String, &'static str> {
    let (scheme, rest) = if let Some(r) = strip_prefix_ignore_case(s, "http://") {
        ("http", r)
    } else if let Some(r) = strip_prefix_ignore_case(s, "https://") {
        ("https", r)
    } else {
        return Err("it must start with \"http://\" or \"https://\"");
    };
    if s.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err("it must not contain blanks");
    }
    if rest.contains(['?', '#']) {
        return Err("it must not have a query or fragment");
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("credentials in the URL are not supported, use a sync token");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6.find(']').ok_or("unterminated IPv6 address")?;
        let after = &v6[end + 1..];
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("invalid port")?),
        };
        (&v6[..end], port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("the host is missing");
    }
    // A bracketed host must be an IPv6 address; any other host has no ':' (the HTTP client
    // cannot use `http://a:b:80` or an unbracketed `::1`, so they fail here, not at runtime).
    let host_ok = if authority.starts_with('[') {
        host.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    };
    if !host_ok {
        return Err("invalid host");
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => {}
            _ => return Err("invalid port"),
        }
    }
    let path = path.trim_end_matches('/');
    Ok(format!("{scheme}://{authority}{path}"))
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_urls_are_normalised() {
        for (input, want) in [
            ("http://127.0.0.1:7700", "http://127.0.0.1:7700"),
            ("HTTP://root.example:7700/", "http://root.example:7700"),
            ("https://root-1.example/yarl//", "https://root-1.example/yarl"),
            ("http://[::1]:7700", "http://[::1]:7700"),
            ("http://[::1]", "http://[::1]"),
        ] {
            assert_eq!(parse_root_url(input).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn bad_urls_say_why() {
        for (input, why) in [
            ("127.0.0.1:7700", "it must start with \"http://\" or \"https://\""),
            ("ftp://root", "it must start with \"http://\" or \"https://\""),
            ("http://root /x", "it must not contain blanks"),
            ("http://root?x=1", "it must not have a query or fragment"),
            ("http://u:p@root", "credentials in the URL are not supported, use a sync token"),
            ("http://[::1", "unterminated IPv6 address"),
            ("http://[::1]x", "invalid port"),
            ("http://:7700", "the host is missing"),
            ("http://", "the host is missing"),
            ("http://a:b:80", "invalid host"),
            ("http://[nope]:80", "invalid host"),
            ("http://root:0", "invalid port"),
            ("http://root:65536", "invalid port"),
            ("http://root:+80", "invalid port"),
        ] {
            assert_eq!(parse_root_url(input), Err(why), "{input}");
        }
    }
}
