//! An OCI distribution client: which hosts to try ([`hosts`]), how to authenticate
//! ([`auth`]), and the requests with retries and stall detection ([`client`]).

pub mod hosts;
