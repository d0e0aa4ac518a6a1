//! Where a request came from, for the audit trail (platform §13): the
//! connection's peer, or — only when the peer is one of
//! `server.trusted_proxies` — the rightmost address of `X-Forwarded-For`
//! that is not itself a trusted proxy (as nginx's `real_ip_recursive`
//! takes it). Put into the request as a [`ClientSource`]; never a header
//! value of a request from an untrusted peer.

use std::net::IpAddr;

use axum::extract::Request;
use axum::http::HeaderMap;
use kayra_catalog::api::audit::ClientSource;
use kayra_config::Cidr;

use crate::listener::Peer;

/// Puts the request's [`ClientSource`] in (nothing without a [`Peer`]).
pub(crate) fn resolve(trusted: &[Cidr], request: &mut Request) {
    if let Some(peer) = request.extensions().get::<Peer>().copied() {
        let source = client(peer.addr.ip(), request.headers(), trusted);
        request.extensions_mut().insert(ClientSource(source));
    }
}

/// The client address of a request from `peer` with `headers`.
pub fn client(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    // Every X-Forwarded-For header, in order, as one chain.
    let chain: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut client = peer;
    for hop in chain.iter().rev() {
        let Ok(ip) = hop.parse::<IpAddr>() else {
            // Not an address: nothing further left can be believed.
            return client;
        };
        client = ip;
        if !is_trusted(ip) {
            return ip;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let chain = forwarded(&["198.51.100.1, 203.0.113.7", "10.0.0.3"]);
        // An untrusted peer: its header is ignored.
        assert_eq!(client(ip("192.0.2.9"), &chain, &trusted), ip("192.0.2.9"));
        // No proxies trusted (the default): the same.
        assert_eq!(client(ip("10.0.0.2"), &chain, &[]), ip("10.0.0.2"));
        // A trusted peer: the rightmost untrusted hop, not the spoofable leftmost.
        assert_eq!(client(ip("10.0.0.2"), &chain, &trusted), ip("203.0.113.7"));
        // Every hop trusted: the leftmost.
        assert_eq!(client(ip("10.0.0.2"), &forwarded(&["10.1.1.1, 10.2.2.2"]), &trusted), ip("10.1.1.1"));
        // Garbage stops the walk at the last believed hop.
        assert_eq!(client(ip("10.0.0.2"), &forwarded(&["203.0.113.7, junk"]), &trusted), ip("10.0.0.2"));
        assert_eq!(client(ip("10.0.0.2"), &HeaderMap::new(), &trusted), ip("10.0.0.2"));
    }
}
