pub mod bench;
pub mod chat;
pub mod load;
pub mod perplexity;
pub mod run;
pub mod serve;
