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
	label VARCHAR NOT NULL, 
	subject VARCHAR NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(candidate_id) REFERENCES candidate (id)
);
INSERT INTO "benchmark" VALUES(1,'rmsnorm',NULL,'sm_90a','rows=8192,N=7168','bfloat16','time:fwd',0.125,'ms','modelled','operator','2026-11-30 12:05:00.000000');
INSERT INTO "benchmark" VALUES(2,'rmsnorm',NULL,'H200','rows=8192,N=7168','bfloat16','time:fwd+bwd',0.5,'ms','measured','eager','2026-11-30 12:06:00.000000');
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
	evidence JSON, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES port_run (id)
);
INSERT INTO "candidate" VALUES(1,'20261130-120000-ab12','rmsnorm',1,'row_block','{"BLOCK_N": 64}','print(''one'')
','h1','/tmp/c1.py','fail','1 of 2 checks failed',2.0,1.5,'{}','2026-11-30 12:00:10.000000');
INSERT INTO "candidate" VALUES(2,'20261130-120000-ab12','rmsnorm',2,'col_tiled','{"TILE_N": 128, "ACC": "float32"}','print(''two'')
','h2','/tmp/c2.py','pass','ok',0.25,2.0,'{"compiles_on": ["sm_90a"], "spill_free_on": ["sm_90a"]}','2026-11-30 12:00:20.000000');
INSERT INTO "candidate" VALUES(3,NULL,'rmsnorm',0,NULL,'{}','print(''file'')
','h3','/tmp/own.py','compile_error','SyntaxError',NULL,NULL,'{}','2026-11-30 12:00:30.000000');
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
INSERT INTO "ci_job" VALUES(1,'e470ffc','pass','{"operators": {"rmsnorm": {"operator": "x.py", "verdict": "pass", "worst_ratio": 0.25, "checks": {"smoke": true}}}, "regressions": []}','/tmp/junit.xml','2026-11-30 12:10:00.000000','2026-11-30 12:12:00.000000');
CREATE TABLE kernel_build (
	id INTEGER NOT NULL, 
	candidate_id INTEGER NOT NULL, 
	kernel VARCHAR NOT NULL, 
	target VARCHAR NOT NULL, 
	suite VARCHAR NOT NULL, 
	specialization JSON, 
	ok BOOLEAN NOT NULL, 
	error VARCHAR NOT NULL, 
	registers INTEGER, 
	spilled_bytes INTEGER, 
	shared_bytes INTEGER, 
	num_warps INTEGER, 
	num_stages INTEGER, 
	ctas_per_sm INTEGER, 
	uses_dot BOOLEAN, 
	tensor_cores BOOLEAN, 
	seconds FLOAT NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(candidate_id) REFERENCES candidate (id)
);
INSERT INTO "kernel_build" VALUES(1,2,'rmsnorm_fwd_kernel','sm_90a','model','{"signature": {"X": "*bf16"}, "num_warps": 4}',1,'',96,0,1024,4,3,5,0,NULL,0.4);
INSERT INTO "kernel_build" VALUES(2,2,'rmsnorm_bwd_kernel','gfx942','model','{}',0,'NameError: Cannot access global variable EPS',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,0.2);
CREATE TABLE loss_replay (
	id INTEGER NOT NULL, 
	model VARCHAR NOT NULL, 
	mode VARCHAR NOT NULL, 
	preset VARCHAR NOT NULL, 
	seed INTEGER NOT NULL, 
	kind VARCHAR NOT NULL, 
	steps INTEGER NOT NULL, 
	backend VARCHAR NOT NULL, 
	ops JSON, 
	curve JSON, 
	reference_curve JSON, 
	status VARCHAR NOT NULL, 
	reason VARCHAR NOT NULL, 
	left_band_step INTEGER, 
	detail JSON, 
	created_at DATETIME NOT NULL, 
	finished_at DATETIME, 
	PRIMARY KEY (id)
);
INSERT INTO "loss_replay" VALUES(1,'kimi-k3.1-pro','scratch','tiny',0,'operators',3,'interpreter','{"rmsnorm": "operators/rmsnorm/x.py", "band": 0.02}','[2.5, 2.1, 1.9]','[2.5, 2.1, 1.91]','pass','',NULL,'{"host": "node-1", "pid": 4243}','2026-11-30 12:07:00.000000','2026-11-30 12:08:00.000000');
INSERT INTO "loss_replay" VALUES(2,'kimi-k3.1-pro','lora','tiny',1,'reference',2,'interpreter','{"all": "reference"}','[3.0, 2.0]','[3.0, 2.0]','reference','',NULL,'{"key": "abc123", "result": {"curve": [3.0, 2.0]}}','2026-11-30 12:09:00.000000','2026-11-30 12:09:00.000000');
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
INSERT INTO "port_run" VALUES('20261130-120000-ab12','rmsnorm','kimi-k3.1-pro','search','interpreter',4,'promoted','passed every suite','{"suites": ["smoke", "edge"], "targets": ["sm_90a"]}','operators/rmsnorm/x.py',2,'node-1',4242,'2026-11-30 12:00:00.000000','2026-11-30 12:03:00.000000');
INSERT INTO "port_run" VALUES('20261130-130000-cd34','swiglu',NULL,'llm','interpreter',2,'blocked','budget spent','{}',NULL,NULL,'node-2',NULL,'2026-11-30 13:00:00.000000',NULL);
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
INSERT INTO "run_step" VALUES(1,'20261130-120000-ab12',1,'plan','chose row_block','{"points": 3}','2026-11-30 12:00:01.000000');
INSERT INTO "run_step" VALUES(2,'20261130-120000-ab12',2,'render','rendered one candidate','{}','2026-11-30 12:00:02.000000');
INSERT INTO "run_step" VALUES(3,'20261130-120000-ab12',3,'verify','passed','{"worst_ratio": 0.25}','2026-11-30 12:00:03.000000');
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
INSERT INTO "verification_check" VALUES(1,1,'interpreter','smoke','rows=4,N=64','float32',0,'forward:y',1,'',1.0e-06,2.0e-06,0.1,1.0e-05,4.0e-06,0);
INSERT INTO "verification_check" VALUES(2,1,'interpreter','edge','rows=1,N=123','float16',1,'grad:x',0,'max abs err 0.5 > bound 0.25',0.5,0.1,0.01,0.1,0.25,2);
INSERT INTO "verification_check" VALUES(3,2,'interpreter','smoke','rows=4,N=64','float32',0,'forward:y',1,'',1.0e-07,NULL,NULL,NULL,4.0e-06,0);
CREATE INDEX ix_port_run_status ON port_run (status);
CREATE INDEX ix_port_run_block ON port_run (block);
CREATE INDEX ix_run_step_run_id ON run_step (run_id);
CREATE INDEX ix_candidate_block ON candidate (block);
CREATE INDEX ix_candidate_run_id ON candidate (run_id);
CREATE INDEX ix_candidate_source_hash ON candidate (source_hash);
CREATE INDEX ix_verification_check_candidate_id ON verification_check (candidate_id);
CREATE INDEX ix_kernel_build_target ON kernel_build (target);
CREATE INDEX ix_kernel_build_candidate_id ON kernel_build (candidate_id);
CREATE INDEX ix_benchmark_block ON benchmark (block);
COMMIT;
