//! The generated Talos API (from `runtime/proto/`, compiled by `build.rs`): one module per
//! protobuf package, each with its messages and its tonic client and server.

#![allow(clippy::all)]

pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}
pub mod common {
    tonic::include_proto!("common");
}
pub mod machine {
    tonic::include_proto!("machine");
}
pub mod cosi {
    pub mod resource {
        tonic::include_proto!("cosi.resource");
    }
}
pub mod resource {
    pub mod config {
        tonic::include_proto!("resource.config");
    }
}
pub mod talos {
    pub mod resource {
        pub mod definitions {
            pub mod k8s {
                tonic::include_proto!("talos.resource.definitions.k8s");
            }
            pub mod v1alpha1 {
                tonic::include_proto!("talos.resource.definitions.v1alpha1");
            }
        }
    }
}
