//! `#[ferry::service]`: turns a trait of `async fn` methods into a ferry
//! RPC service. For `trait Calc` it generates:
//!
//! - the trait itself, with each `async fn m(&self, ..) -> R` rewritten to
//!   `fn m(&self, ..) -> impl Future<Output = R> + Send` (so handlers can run
//!   on any processor) and `Send + Sync + 'static` as supertraits;
//! - `CalcClient`: `bind`/`bind_to`/`connect` (checks the interface), and per method
//!   `m` (async: a promise), `m_blocking`, `m_oneway(checkpoint)`, `m_batched`;
//! - `CalcServer<S>`: the dispatcher (`ferry::rpc::Dispatch`) and `serve`;
//! - `CalcRequest`: one variant per method with its arguments and a typed
//!   reply handle, for explicit receipt (`CalcRequest::from_call`).
//!
//! A method returning `Result<T, E>` reports `E` to the caller as
//! `RpcError::Remote(E)`; any other return type is the result itself.
//!
//! Arguments and results travel in ferry's codec (MessagePack). Types are
//! recognized by how they are written (the descriptor keeps them as written):
//!
//! - `&T` arguments (`&[u8]`, `&str`, `&MyStruct`, ...; not `&mut`): the
//!   client stub takes the reference; the server decodes the owned form
//!   (`[T]` → `Vec<T>`, `str` → `String`, otherwise `T`) and lends it to the
//!   handler. The request enum's field is the owned form.
//! - `[u8; N]` and `&[u8; N]` arguments, and `[u8; N]` results (also as
//!   the `T` of `Result<T, E>`; written as an array type of `u8`, N any
//!   constant): MessagePack bin of N bytes (a sequence of N integers is
//!   accepted too); another length is a codec error. With explicit receipt
//!   (`Reply::ok`) an array result is written as serde writes an array.
//! - `Vec<u8>`, `&[u8]`, `bytes::Bytes` (its `serde` feature),
//!   `serde_bytes::ByteBuf` and `ferry::Bytes` need nothing from the macro:
//!   each is bin through the codec or its own `Serialize`.

#![deny(missing_docs)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::{
    parse_macro_input, FnArg, GenericArgument, Ident, ItemTrait, Pat, PathArguments, ReturnType, TraitItem, Type,
};

/// Makes a trait of `async fn` methods a ferry RPC service: generates its
/// client, dispatcher and request enum (see the crate documentation).
#[proc_macro_attribute]
pub fn service(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[ferry::service] takes no arguments").to_compile_error().into();
    }
    let input = parse_macro_input!(item as ItemTrait);
    match expand(input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

struct Method {
    name: Ident,
    attrs: Vec<syn::Attribute>,
    args: Vec<(Ident, Type)>,
    /// How each argument travels (same order as `args`).
    kinds: Vec<Arg>,
    ret: Type,
    /// `Some((T, E))` when the method returns `Result<T, E>`.
    result: Option<(Type, Type)>,
}

fn expand(input: ItemTrait) -> syn::Result<Tokens> {
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(&input.generics, "a ferry service trait cannot be generic"));
    }
    let methods = input.items.iter().map(method).collect::<syn::Result<Vec<_>>>()?;
    // The client has `m`, `m_blocking`, `m_oneway`, `m_batched` per method: no two may meet.
    let mut taken = std::collections::HashMap::new();
    for m in &methods {
        for suffix in ["", "_blocking", "_oneway", "_batched"] {
            let generated = format!("{}{suffix}", m.name);
            if let Some(other) = taken.insert(generated.clone(), m.name.to_string()) {
                return Err(syn::Error::new_spanned(
                    &m.name,
                    format!(
                        "client method `{generated}` of `{}` collides with the one made for `{other}`; rename one",
                        m.name
                    ),
                ));
            }
        }
    }
    let vis = &input.vis;
    let trait_name = &input.ident;
    let attrs = &input.attrs;
    let client = format_ident!("{}Client", trait_name);
    let server = format_ident!("{}Server", trait_name);
    let request = format_ident!("{}Request", trait_name);
    let service_name = trait_name.to_string();

    let trait_methods = methods.iter().map(|m| {
        let (name, attrs, ret) = (&m.name, &m.attrs, &m.ret);
        let args = m.args.iter().map(|(n, t)| quote!(#n: #t));
        quote! {
            #(#attrs)*
            fn #name(&self, #(#args),*) -> impl ::core::future::Future<Output = #ret> + ::core::marker::Send;
        }
    });

    let descriptors = methods.iter().map(|m| {
        let name = m.name.to_string();
        let args = m.args.iter().map(|(n, t)| {
            let (n, t) = (n.to_string(), type_string(t));
            quote!((#n.to_string(), #t.to_string()))
        });
        let ret = type_string(&m.ret);
        quote! {
            ::ferry::rpc::MethodDescriptor { name: #name.to_string(), args: vec![#(#args),*], ret: #ret.to_string() }
        }
    });

    let client_methods = methods.iter().enumerate().map(|(i, m)| {
        let i = i as u32;
        let name = &m.name;
        let (blocking, oneway, batched) =
            (format_ident!("{}_blocking", name), format_ident!("{}_oneway", name), format_ident!("{}_batched", name));
        let params: Vec<_> = m.args.iter().map(|(n, t)| quote!(#n: #t)).collect();
        let names: Vec<_> = m.args.iter().zip(&m.kinds).map(|((n, _), k)| k.encode(n)).collect();
        let (t, e) = ok_err(m);
        // A `[u8; N]` result is decoded through its bytes wrapper, then converted.
        let (call_ty, converted, blocking_wire, unwrap) = match result_array(m) {
            Some(len) => (
                quote!(::ferry::rpc::CallFuture<#t, #e, ::ferry::rpc::__private::ByteArray<{ #len }>>),
                quote!(.converted()),
                quote!(::ferry::rpc::__private::ByteArray<{ #len }>),
                quote!(.map(|a| a.0)),
            ),
            None => (quote!(::ferry::rpc::CallFuture<#t, #e>), quote!(), quote!(#t), quote!()),
        };
        let doc = format!("Calls `{name}`; the future (a promise) resolves to its result. Dropping it cancels the call.");
        let blocking_doc = format!("Calls `{name}` and blocks this thread for its result.");
        let oneway_doc = format!(
            "Calls `{name}` without a result; returns at `checkpoint`. Its value is discarded; \
             with `OnReturn`, the handler's error or panic is reported as for a call."
        );
        let batched_doc = format!("Queues a call of `{name}` without a result, sent in order with the next call or `flush`.");
        quote! {
            #[doc = #doc]
            pub fn #name(&self, #(#params),*) -> #call_ty {
                self.client.call(#i, &(#(#names,)*))#converted
            }
            #[doc = #blocking_doc]
            pub fn #blocking(&self, #(#params),*) -> ::core::result::Result<#t, ::ferry::rpc::RpcError<#e>> {
                self.client.call_blocking::<_, #blocking_wire, #e>(#i, &(#(#names,)*))#unwrap
            }
            #[doc = #oneway_doc]
            pub fn #oneway(&self, #(#params,)* checkpoint: ::ferry::Checkpoint) -> ::core::result::Result<(), ::ferry::rpc::RpcError<#e>> {
                self.client.send_oneway(#i, &(#(#names,)*), checkpoint)
            }
            #[doc = #batched_doc]
            pub fn #batched(&self, #(#params),*) -> ::core::result::Result<(), ::ferry::rpc::RpcError> {
                self.client.batch(#i, &(#(#names,)*))
            }
        }
    });

    let dispatch_arms = methods.iter().enumerate().map(|(i, m)| {
        let i = i as u32;
        let name = &m.name;
        let names: Vec<_> = m.args.iter().map(|(n, _)| n).collect();
        let types: Vec<_> = m.kinds.iter().map(Arg::wire).collect();
        let pass: Vec<_> = m.args.iter().zip(&m.kinds).map(|((n, _), k)| k.pass(n)).collect();
        let value = |v: Tokens| match result_array(m) {
            Some(_) => quote!(::ferry::rpc::__private::ByteArray(#v)),
            None => quote!(#v),
        };
        let respond = if m.result.is_some() {
            let ok = value(quote!(v));
            quote! {
                match r {
                    ::core::result::Result::Ok(v) => ::ferry::rpc::__private::ok(#ok),
                    ::core::result::Result::Err(e) => ::ferry::rpc::__private::remote(e),
                }
            }
        } else {
            let ok = value(quote!(r));
            quote!(::ferry::rpc::__private::ok(#ok))
        };
        quote! {
            #i => {
                let (#(#names,)*): (#(#types,)*) = match ::ferry::rpc::__private::decode(args) {
                    ::core::result::Result::Ok(v) => v,
                    ::core::result::Result::Err(e) => return e,
                };
                ::ferry::rpc::HandlerFuture::new(async move {
                    let r = self.0.#name(#(#pass),*).await;
                    #respond
                })
            }
        }
    });

    let variants: Vec<Ident> = methods.iter().map(|m| format_ident!("{}", camel(&m.name.to_string()))).collect();
    let request_variants = methods.iter().zip(&variants).map(|(m, v)| {
        let fields = m.args.iter().zip(&m.kinds).map(|((n, _), k)| {
            let doc = format!("Argument `{n}`.");
            let t = k.owned();
            quote!(#[doc = #doc] #n: #t)
        });
        let (t, e) = ok_err(m);
        let doc = format!("A call of `{}`.", m.name);
        quote! {
            #[doc = #doc]
            #v {
                #(#fields,)*
                /// Answers the call.
                reply: ::ferry::rpc::Reply<#t, #e>
            }
        }
    });
    let request_arms = methods.iter().zip(&variants).enumerate().map(|(i, (m, v))| {
        let i = i as u32;
        let names: Vec<_> = m.args.iter().map(|(n, _)| n).collect();
        let types: Vec<_> = m.kinds.iter().map(Arg::wire).collect();
        let fields: Vec<_> = m.args.iter().zip(&m.kinds).map(|((n, _), k)| k.field(n)).collect();
        quote! {
            #i => match __ferry_call.take_args::<(#(#types,)*)>() {
                ::core::result::Result::Ok((#(#names,)*)) => {
                    ::core::result::Result::Ok(#request::#v { #(#fields,)* reply: ::ferry::rpc::Reply::new(__ferry_call) })
                }
                ::core::result::Result::Err(e) => {
                    let _ = __ferry_call.refuse(&e.to_string());
                    ::core::result::Result::Err(e)
                }
            },
        }
    });

    Ok(quote! {
        #(#attrs)*
        #vis trait #trait_name: ::core::marker::Send + ::core::marker::Sync + 'static {
            #(#trait_methods)*
        }

        #[doc = concat!("Client stub of the `", #service_name, "` service.")]
        #[derive(Clone)]
        #vis struct #client {
            client: ::ferry::rpc::Client,
        }

        impl #client {
            /// The interface as exchanged at bind time.
            pub fn descriptor() -> ::ferry::rpc::ServiceDescriptor {
                ::ferry::rpc::ServiceDescriptor {
                    name: #service_name.to_string(),
                    codec: ::ferry::rpc::CODEC.to_string(),
                    methods: vec![#(#descriptors),*],
                }
            }
            /// Looks `name` up and binds; refused if the server's interface differs.
            pub fn bind(team: &::ferry::Team, name: &str) -> ::core::result::Result<Self, ::ferry::rpc::RpcError> {
                ::core::result::Result::Ok(Self { client: ::ferry::rpc::Client::bind(team, name, Self::descriptor())? })
            }
            /// `bind`, waiting up to `limit` for `name` to be registered (see `Team::lookup_wait`).
            pub fn bind_wait(team: &::ferry::Team, name: &str, limit: ::std::time::Duration)
                -> ::core::result::Result<Self, ::ferry::rpc::RpcError>
            {
                ::core::result::Result::Ok(Self { client: ::ferry::rpc::Client::bind_wait(team, name, Self::descriptor(), limit)? })
            }
            /// Binds to the service at `endpoint`; refused if its interface differs.
            pub fn bind_to(team: &::ferry::Team, endpoint: ::ferry::EndpointId) -> ::core::result::Result<Self, ::ferry::rpc::RpcError> {
                ::core::result::Result::Ok(Self { client: ::ferry::rpc::Client::bind_to(team, endpoint, Self::descriptor())? })
            }
            /// `bind_to` as a future, for use inside tasks and handlers.
            pub fn connect(team: &::ferry::Team, endpoint: ::ferry::EndpointId)
                -> impl ::core::future::Future<Output = ::core::result::Result<Self, ::ferry::rpc::RpcError>> + ::core::marker::Send + 'static
            {
                let connecting = ::ferry::rpc::Client::connect(team, endpoint, Self::descriptor());
                async move { ::core::result::Result::Ok(Self { client: connecting.await? }) }
            }
            /// The untyped client underneath.
            pub fn client(&self) -> &::ferry::rpc::Client {
                &self.client
            }
            /// The same client with a deadline on every call.
            pub fn with_timeout(&self, limit: ::std::time::Duration) -> Self {
                Self { client: self.client.with_timeout(limit) }
            }
            /// The same client, whose calls are retryable: one lost with its
            /// connection is sent once more, and the server runs it at most once
            /// (see `ferry::rpc::Client::retrying`).
            pub fn retrying(&self) -> Self {
                Self { client: self.client.retrying() }
            }
            /// Sends the batched calls and waits until the server ran them.
            pub fn flush(&self) -> ::core::result::Result<(), ::ferry::rpc::RpcError> {
                self.client.flush()
            }
            #(#client_methods)*
        }

        #[doc = concat!("Dispatcher of the `", #service_name, "` service over an implementation `S`.")]
        #vis struct #server<S>(
            /// The implementation.
            pub ::std::sync::Arc<S>,
        );

        impl<S: #trait_name> #server<S> {
            /// A dispatcher of `service`.
            pub fn new(service: S) -> Self {
                Self(::std::sync::Arc::new(service))
            }
            /// Binds `name` and serves it, a task per call, until the handle is dropped.
            pub fn serve(team: &::ferry::Team, name: &str, service: S) -> ::ferry::Result<::ferry::rpc::Serving> {
                let endpoint = ::ferry::rpc::ServiceEndpoint::open(team, name, #client::descriptor())?;
                ::core::result::Result::Ok(endpoint.serve(::std::sync::Arc::new(Self::new(service))))
            }
        }

        impl<S: #trait_name> ::ferry::rpc::Dispatch for #server<S> {
            fn descriptor(&self) -> ::ferry::rpc::ServiceDescriptor {
                #client::descriptor()
            }
            fn dispatch(self: ::std::sync::Arc<Self>, method: u32, args: ::ferry::rpc::Args) -> ::ferry::rpc::HandlerFuture {
                match method {
                    #(#dispatch_arms)*
                    other => ::ferry::rpc::__private::no_such_method(other),
                }
            }
        }

        #[doc = concat!("A call to the `", #service_name, "` service, for explicit receipt.")]
        #vis enum #request {
            #(#request_variants),*
        }

        impl #request {
            /// Decodes an accepted call; a call that does not decode is refused to its caller.
            pub fn from_call(mut __ferry_call: ::ferry::rpc::IncomingCall) -> ::core::result::Result<Self, ::ferry::rpc::RpcError> {
                match __ferry_call.method() {
                    #(#request_arms)*
                    _ => ::core::result::Result::Err(::ferry::rpc::__private::refuse_no_such_method(__ferry_call)),
                }
            }
        }
    })
}

fn method(item: &TraitItem) -> syn::Result<Method> {
    let TraitItem::Fn(f) = item else {
        return Err(syn::Error::new_spanned(item, "a ferry service trait holds only `async fn` methods"));
    };
    let sig = &f.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(sig, "service methods must be `async fn`"));
    }
    if !sig.generics.params.is_empty() || f.default.is_some() {
        return Err(syn::Error::new_spanned(sig, "service methods cannot be generic or have a body"));
    }
    let mut inputs = sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Receiver(r)) if r.reference.is_some() && r.mutability.is_none() => {}
        _ => return Err(syn::Error::new_spanned(sig, "service methods take `&self` first")),
    }
    let args = inputs
        .map(|a| match a {
            FnArg::Typed(pt) => match &*pt.pat {
                // `reply` is a field of the request variants, `checkpoint` a parameter of `_oneway`.
                Pat::Ident(id)
                    if id.ident == "reply"
                        || id.ident == "checkpoint"
                        || id.ident.to_string().starts_with("__ferry") =>
                {
                    Err(syn::Error::new_spanned(id, "this argument name is reserved by #[ferry::service]; rename it"))
                }
                Pat::Ident(id) => Ok((id.ident.clone(), (*pt.ty).clone())),
                other => Err(syn::Error::new_spanned(other, "arguments must be plain names")),
            },
            FnArg::Receiver(r) => Err(syn::Error::new_spanned(r, "unexpected receiver")),
        })
        .collect::<syn::Result<Vec<_>>>()?;
    let kinds = args.iter().map(|(_, t)| Arg::of(t)).collect::<syn::Result<Vec<_>>>()?;
    let ret: Type = match &sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, t) => (**t).clone(),
    };
    Ok(Method { name: sig.ident.clone(), attrs: f.attrs.clone(), args, kinds, result: result_parts(&ret), ret })
}

/// How an argument travels, from how its type is written.
enum Arg {
    /// As itself.
    Owned(Type),
    /// `&T`: the reference is encoded; the server decodes the owned form and lends it.
    Ref(Type),
    /// `[u8; N]` (`by_ref`: written `&[u8; N]`): bin of N bytes.
    Array { len: syn::Expr, by_ref: bool },
}

impl Arg {
    fn of(t: &Type) -> syn::Result<Arg> {
        if let Some(len) = byte_array(t) {
            return Ok(Arg::Array { len, by_ref: false });
        }
        let Type::Reference(r) = t else { return Ok(Arg::Owned(t.clone())) };
        if r.mutability.is_some() {
            return Err(syn::Error::new_spanned(t, "a service argument cannot be `&mut`"));
        }
        if let Some(len) = byte_array(&r.elem) {
            return Ok(Arg::Array { len, by_ref: true });
        }
        let owned = match &*r.elem {
            Type::Slice(s) => {
                let e = &s.elem;
                syn::parse_quote!(::std::vec::Vec<#e>)
            }
            Type::Path(p) if p.qself.is_none() && p.path.is_ident("str") => syn::parse_quote!(::std::string::String),
            other => other.clone(),
        };
        Ok(Arg::Ref(owned))
    }

    /// The type the server decodes.
    fn wire(&self) -> Tokens {
        match self {
            Arg::Owned(t) | Arg::Ref(t) => quote!(#t),
            Arg::Array { len, .. } => quote!(::ferry::rpc::__private::ByteArray<{ #len }>),
        }
    }

    /// The field of the request enum: what the caller sent, owned.
    fn owned(&self) -> Tokens {
        match self {
            Arg::Owned(t) | Arg::Ref(t) => quote!(#t),
            Arg::Array { len, .. } => quote!([u8; #len]),
        }
    }

    /// What the client encodes for argument `n`.
    fn encode(&self, n: &Ident) -> Tokens {
        match self {
            Arg::Owned(_) | Arg::Ref(_) => quote!(#n),
            Arg::Array { .. } => quote!(::ferry::rpc::__private::BytesRef(&#n[..])),
        }
    }

    /// What the server hands the handler, from the decoded `n`.
    fn pass(&self, n: &Ident) -> Tokens {
        match self {
            Arg::Owned(_) => quote!(#n),
            Arg::Ref(_) => quote!(&#n),
            Arg::Array { by_ref: false, .. } => quote!(#n.0),
            Arg::Array { by_ref: true, .. } => quote!(&#n.0),
        }
    }

    /// The request enum's field initializer, from the decoded `n`.
    fn field(&self, n: &Ident) -> Tokens {
        match self {
            Arg::Array { .. } => quote!(#n: #n.0),
            _ => quote!(#n),
        }
    }
}

/// `Some(N)` if `t` is written `[u8; N]`.
fn byte_array(t: &Type) -> Option<syn::Expr> {
    let Type::Array(a) = t else { return None };
    let Type::Path(p) = &*a.elem else { return None };
    (p.qself.is_none() && p.path.is_ident("u8")).then(|| a.len.clone())
}

/// `Some(N)` if the method's result (the `T` of `Result<T, E>`) is `[u8; N]`.
fn result_array(m: &Method) -> Option<syn::Expr> {
    match &m.result {
        Some((t, _)) => byte_array(t),
        None => byte_array(&m.ret),
    }
}

/// `Some((T, E))` if `ty` is written `Result<T, E>`.
fn result_parts(ty: &Type) -> Option<(Type, Type)> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    let mut types = args.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(t), Some(e), None) => Some((t, e)),
        _ => None,
    }
}

/// The result and remote-error types a caller sees.
fn ok_err(m: &Method) -> (Tokens, Tokens) {
    match &m.result {
        Some((t, e)) => (quote!(#t), quote!(#e)),
        None => {
            let r = &m.ret;
            (quote!(#r), quote!(::ferry::rpc::Never))
        }
    }
}

/// A type as written, without spaces: what the fingerprint compares.
fn type_string(t: &Type) -> String {
    quote!(#t).to_string().replace(' ', "")
}

fn camel(s: &str) -> String {
    s.split('_').filter(|p| !p.is_empty()).map(|p| p[..1].to_uppercase() + &p[1..]).collect()
}
