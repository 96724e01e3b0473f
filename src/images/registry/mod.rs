//! Registry client: hosts, auth, and the HTTP client.
