//! What a service looks like: its name, codec and methods with their
//! argument and result types. Exchanged when a client binds, so a client
//! built against another version of the interface is refused at once, with
//! the first difference named.

use serde::{Deserialize, Serialize};

/// The codec every typed RPC payload uses (see docs/WIRE.md).
pub const CODEC: &str = "msgpack/2";

/// A service's interface, as its trait declares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceDescriptor {
    /// The trait's name.
    pub name: String,
    /// The payload codec ([`CODEC`]).
    pub codec: String,
    /// The methods in declaration order (a method's index is its number on the wire).
    pub methods: Vec<MethodDescriptor>,
}

/// One method of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MethodDescriptor {
    /// The method's name.
    pub name: String,
    /// (argument name, type as written) in order.
    pub args: Vec<(String, String)>,
    /// The result type as written (`Result<T, E>` included).
    pub ret: String,
}

impl ServiceDescriptor {
    /// The first way `client` differs from `self` (the server), in words; `None` if they match.
    pub fn first_difference(&self, client: &ServiceDescriptor) -> Option<String> {
        if self.name != client.name {
            return Some(format!("service is {:?} here, the client expects {:?}", self.name, client.name));
        }
        if self.codec != client.codec {
            return Some(format!("codec is {} here, the client uses {}", self.codec, client.codec));
        }
        for (i, (s, c)) in self.methods.iter().zip(&client.methods).enumerate() {
            if s.name != c.name {
                return Some(format!("method #{i} is {} here, {} in the client", s.name, c.name));
            }
            let m = &s.name;
            if s.args.len() != c.args.len() {
                return Some(format!("{m} takes {} arguments here, {} in the client", s.args.len(), c.args.len()));
            }
            for ((sn, st), (cn, ct)) in s.args.iter().zip(&c.args) {
                if st != ct || sn != cn {
                    return Some(format!("{m}: argument {sn} is {st} here, {cn} is {ct} in the client"));
                }
            }
            if s.ret != c.ret {
                return Some(format!("{m} returns {} here, {} in the client", s.ret, c.ret));
            }
        }
        match self.methods.len().cmp(&client.methods.len()) {
            std::cmp::Ordering::Less => Some(format!(
                "the client has method {} that this service lacks",
                client.methods[self.methods.len()].name
            )),
            std::cmp::Ordering::Greater => Some(format!(
                "this service has method {} that the client lacks",
                self.methods[client.methods.len()].name
            )),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// A 64-bit digest of the whole descriptor (FNV-1a), for logs and quick checks.
    pub fn fingerprint(&self) -> u64 {
        let bytes = crate::wire::codec::encode(self).unwrap_or_default();
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ret: &str, arg: &str) -> ServiceDescriptor {
        ServiceDescriptor {
            name: "Calc".into(),
            codec: CODEC.into(),
            methods: vec![MethodDescriptor {
                name: "add".into(),
                args: vec![("a".into(), "i32".into()), ("b".into(), arg.into())],
                ret: ret.into(),
            }],
        }
    }

    #[test]
    fn names_the_first_difference() {
        assert_eq!(svc("i32", "i32").first_difference(&svc("i32", "i32")), None);
        assert_eq!(
            svc("i32", "i32").first_difference(&svc("i32", "i64")).unwrap(),
            "add: argument b is i32 here, b is i64 in the client"
        );
        assert_eq!(
            svc("i32", "i32").first_difference(&svc("u8", "i32")).unwrap(),
            "add returns i32 here, u8 in the client"
        );
        let mut renamed = svc("i32", "i32");
        renamed.methods[0].args[1].0 = "c".into();
        assert_eq!(
            svc("i32", "i32").first_difference(&renamed).unwrap(),
            "add: argument b is i32 here, c is i32 in the client"
        );
        let mut more = svc("i32", "i32");
        more.methods.push(MethodDescriptor { name: "sub".into(), args: vec![], ret: "()".into() });
        assert_eq!(
            svc("i32", "i32").first_difference(&more).unwrap(),
            "the client has method sub that this service lacks"
        );
        assert_ne!(svc("i32", "i32").fingerprint(), more.fingerprint());
    }
}
