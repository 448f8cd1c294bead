pub mod bench;
pub mod chat;
pub mod load;
pub mod run;
pub mod serve;
