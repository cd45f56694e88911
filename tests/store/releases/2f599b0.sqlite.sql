BEGIN TRANSACTION;
CREATE TABLE benchmark (
	id INTEGER NOT NULL, 
	block VARCHAR NOT NULL, 
	candidate_id INTEGER, 
	backend VARCHAR NOT NULL, 
	shape VARCHAR NOT NULL, 
	dtype VARCHAR NOT NULL, 
	metric VARCHAR NOT NULL, 
	value FLOAT NOT NULL, 
	unit VARCHAR NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(candidate_id) REFERENCES candidate (id)
);
CREATE TABLE block (
	name VARCHAR NOT NULL, 
	family VARCHAR NOT NULL, 
	summary VARCHAR NOT NULL, 
	synced_at DATETIME NOT NULL, 
	PRIMARY KEY (name)
);
CREATE TABLE candidate (
	id INTEGER NOT NULL, 
	run_id VARCHAR, 
	block VARCHAR NOT NULL, 
	iteration INTEGER NOT NULL, 
	template VARCHAR, 
	params JSON, 
	source TEXT, 
	source_hash VARCHAR NOT NULL, 
	path VARCHAR NOT NULL, 
	status VARCHAR NOT NULL, 
	message VARCHAR NOT NULL, 
	worst_ratio FLOAT, 
	verify_seconds FLOAT, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES port_run (id)
);
CREATE TABLE ci_job (
	id INTEGER NOT NULL, 
	"commit" VARCHAR NOT NULL, 
	status VARCHAR NOT NULL, 
	summary JSON, 
	junit_path VARCHAR, 
	started_at DATETIME NOT NULL, 
	finished_at DATETIME, 
	PRIMARY KEY (id)
);
CREATE TABLE loss_replay (
	id INTEGER NOT NULL, 
	model VARCHAR NOT NULL, 
	mode VARCHAR NOT NULL, 
	preset VARCHAR NOT NULL, 
	seed INTEGER NOT NULL, 
	ops JSON, 
	curve JSON, 
	reference_curve JSON, 
	status VARCHAR NOT NULL, 
	reason VARCHAR NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id)
);
CREATE TABLE model (
	name VARCHAR NOT NULL, 
	title VARCHAR NOT NULL, 
	card JSON, 
	synced_at DATETIME NOT NULL, 
	PRIMARY KEY (name)
);
CREATE TABLE port_run (
	id VARCHAR NOT NULL, 
	block VARCHAR NOT NULL, 
	model VARCHAR, 
	proposer VARCHAR NOT NULL, 
	backend VARCHAR NOT NULL, 
	budget INTEGER NOT NULL, 
	status VARCHAR NOT NULL, 
	reason VARCHAR NOT NULL, 
	config JSON, 
	operator_path VARCHAR, 
	best_candidate_id INTEGER, 
	host VARCHAR NOT NULL, 
	pid INTEGER, 
	started_at DATETIME NOT NULL, 
	finished_at DATETIME, 
	PRIMARY KEY (id)
);
CREATE TABLE run_step (
	id INTEGER NOT NULL, 
	run_id VARCHAR NOT NULL, 
	seq INTEGER NOT NULL, 
	node VARCHAR NOT NULL, 
	message VARCHAR NOT NULL, 
	data JSON, 
	at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES port_run (id)
);
CREATE TABLE verification_check (
	id INTEGER NOT NULL, 
	candidate_id INTEGER NOT NULL, 
	backend VARCHAR NOT NULL, 
	suite VARCHAR NOT NULL, 
	shape VARCHAR NOT NULL, 
	dtype VARCHAR NOT NULL, 
	seed INTEGER NOT NULL, 
	direction VARCHAR NOT NULL, 
	passed BOOLEAN NOT NULL, 
	reason VARCHAR NOT NULL, 
	max_abs FLOAT, 
	max_rel FLOAT, 
	err_ratio FLOAT, 
	ref_err FLOAT, 
	bound FLOAT, 
	nonfinite INTEGER NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(candidate_id) REFERENCES candidate (id)
);
CREATE INDEX ix_port_run_status ON port_run (status);
CREATE INDEX ix_port_run_block ON port_run (block);
CREATE INDEX ix_run_step_run_id ON run_step (run_id);
CREATE INDEX ix_candidate_run_id ON candidate (run_id);
CREATE INDEX ix_candidate_block ON candidate (block);
CREATE INDEX ix_candidate_source_hash ON candidate (source_hash);
CREATE INDEX ix_verification_check_candidate_id ON verification_check (candidate_id);
CREATE INDEX ix_benchmark_block ON benchmark (block);
COMMIT;
