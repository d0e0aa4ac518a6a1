//! placeholder (being written): etcd backend.
use crate::{Backend, Error, KeyValue, ListPage, Result, Revision, WatchStream};

pub struct EtcdStore;

impl EtcdStore {
    pub async fn connect(_cfg: &kayra_config::EtcdConfig) -> Result<Self> {
        Err(Error::Unavailable("etcd backend not built yet".into()))
    }
}

#[async_trait::async_trait]
impl Backend for EtcdStore {
    async fn get(&self, _key: &str) -> Result<(Option<KeyValue>, Revision)> {
        unimplemented!()
    }
    async fn list(&self, _prefix: &str, _start_after: Option<&str>, _limit: usize) -> Result<ListPage> {
        unimplemented!()
    }
    async fn create(&self, _key: &str, _value: Vec<u8>) -> Result<Revision> {
        unimplemented!()
    }
    async fn update(&self, _key: &str, _value: Vec<u8>, _expected: Revision) -> Result<Revision> {
        unimplemented!()
    }
    async fn delete(&self, _key: &str, _expected: Option<Revision>) -> Result<Revision> {
        unimplemented!()
    }
    async fn watch(&self, _prefix: &str, _from: Revision) -> Result<WatchStream> {
        unimplemented!()
    }
    async fn revision(&self) -> Result<Revision> {
        unimplemented!()
    }
}
