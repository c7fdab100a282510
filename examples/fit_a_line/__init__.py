"""fit-a-line: linear regression on generated CSV shards, trained by collective trainers."""
