--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: benchmark; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.benchmark (
    id integer NOT NULL,
    block character varying NOT NULL,
    candidate_id integer,
    backend character varying NOT NULL,
    shape character varying NOT NULL,
    dtype character varying NOT NULL,
    metric character varying NOT NULL,
    value double precision NOT NULL,
    unit character varying NOT NULL,
    label character varying NOT NULL,
    subject character varying NOT NULL,
    created_at timestamp with time zone NOT NULL
);


--
-- Name: benchmark_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.benchmark_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: benchmark_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.benchmark_id_seq OWNED BY public.benchmark.id;


--
-- Name: candidate; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.candidate (
    id integer NOT NULL,
    run_id character varying,
    block character varying NOT NULL,
    iteration integer NOT NULL,
    template character varying,
    params json,
    source text,
    source_hash character varying NOT NULL,
    path character varying NOT NULL,
    status character varying NOT NULL,
    message character varying NOT NULL,
    worst_ratio double precision,
    verify_seconds double precision,
    evidence json,
    created_at timestamp with time zone NOT NULL
);


--
-- Name: candidate_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.candidate_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: candidate_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.candidate_id_seq OWNED BY public.candidate.id;


--
-- Name: ci_job; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ci_job (
    id integer NOT NULL,
    commit character varying NOT NULL,
    status character varying NOT NULL,
    summary json,
    junit_path character varying,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone
);


--
-- Name: ci_job_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.ci_job_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: ci_job_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.ci_job_id_seq OWNED BY public.ci_job.id;


--
-- Name: kernel_build; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.kernel_build (
    id integer NOT NULL,
    candidate_id integer NOT NULL,
    kernel character varying NOT NULL,
    target character varying NOT NULL,
    suite character varying NOT NULL,
    specialization json,
    ok boolean NOT NULL,
    error character varying NOT NULL,
    registers integer,
    spilled_bytes integer,
    shared_bytes integer,
    num_warps integer,
    num_stages integer,
    ctas_per_sm integer,
    uses_dot boolean,
    tensor_cores boolean,
    seconds double precision NOT NULL
);


--
-- Name: kernel_build_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.kernel_build_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: kernel_build_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.kernel_build_id_seq OWNED BY public.kernel_build.id;


--
-- Name: loss_replay; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.loss_replay (
    id integer NOT NULL,
    model character varying NOT NULL,
    mode character varying NOT NULL,
    preset character varying NOT NULL,
    seed integer NOT NULL,
    kind character varying NOT NULL,
    steps integer NOT NULL,
    backend character varying NOT NULL,
    ops json,
    curve json,
    reference_curve json,
    status character varying NOT NULL,
    reason character varying NOT NULL,
    left_band_step integer,
    detail json,
    created_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone
);


--
-- Name: loss_replay_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.loss_replay_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: loss_replay_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.loss_replay_id_seq OWNED BY public.loss_replay.id;


--
-- Name: port_run; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.port_run (
    id character varying NOT NULL,
    block character varying NOT NULL,
    model character varying,
    proposer character varying NOT NULL,
    backend character varying NOT NULL,
    budget integer NOT NULL,
    status character varying NOT NULL,
    reason character varying NOT NULL,
    config json,
    operator_path character varying,
    best_candidate_id integer,
    host character varying NOT NULL,
    pid integer,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone
);


--
-- Name: run_step; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.run_step (
    id integer NOT NULL,
    run_id character varying NOT NULL,
    seq integer NOT NULL,
    node character varying NOT NULL,
    message character varying NOT NULL,
    data json,
    at timestamp with time zone NOT NULL
);


--
-- Name: run_step_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.run_step_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: run_step_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.run_step_id_seq OWNED BY public.run_step.id;


--
-- Name: verification_check; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.verification_check (
    id integer NOT NULL,
    candidate_id integer NOT NULL,
    backend character varying NOT NULL,
    suite character varying NOT NULL,
    shape character varying NOT NULL,
    dtype character varying NOT NULL,
    seed integer NOT NULL,
    direction character varying NOT NULL,
    passed boolean NOT NULL,
    reason character varying NOT NULL,
    max_abs double precision,
    max_rel double precision,
    err_ratio double precision,
    ref_err double precision,
    bound double precision,
    nonfinite integer NOT NULL
);


--
-- Name: verification_check_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.verification_check_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: verification_check_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.verification_check_id_seq OWNED BY public.verification_check.id;


--
-- Name: benchmark id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.benchmark ALTER COLUMN id SET DEFAULT nextval('public.benchmark_id_seq'::regclass);


--
-- Name: candidate id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.candidate ALTER COLUMN id SET DEFAULT nextval('public.candidate_id_seq'::regclass);


--
-- Name: ci_job id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ci_job ALTER COLUMN id SET DEFAULT nextval('public.ci_job_id_seq'::regclass);


--
-- Name: kernel_build id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.kernel_build ALTER COLUMN id SET DEFAULT nextval('public.kernel_build_id_seq'::regclass);


--
-- Name: loss_replay id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.loss_replay ALTER COLUMN id SET DEFAULT nextval('public.loss_replay_id_seq'::regclass);


--
-- Name: run_step id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.run_step ALTER COLUMN id SET DEFAULT nextval('public.run_step_id_seq'::regclass);


--
-- Name: verification_check id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.verification_check ALTER COLUMN id SET DEFAULT nextval('public.verification_check_id_seq'::regclass);


--
-- Data for Name: benchmark; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.benchmark VALUES (1, 'rmsnorm', NULL, 'sm_90a', 'rows=8192,N=7168', 'bfloat16', 'time:fwd', 0.125, 'ms', 'modelled', 'operator', '2026-11-30 12:05:00+00');
INSERT INTO public.benchmark VALUES (2, 'rmsnorm', NULL, 'H200', 'rows=8192,N=7168', 'bfloat16', 'time:fwd+bwd', 0.5, 'ms', 'measured', 'eager', '2026-11-30 12:06:00+00');


--
-- Data for Name: candidate; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.candidate VALUES (1, '20261130-120000-ab12', 'rmsnorm', 1, 'row_block', '{"BLOCK_N": 64}', 'print(''one'')
', 'h1', '/tmp/c1.py', 'fail', '1 of 2 checks failed', 2, 1.5, '{}', '2026-11-30 12:00:10+00');
INSERT INTO public.candidate VALUES (2, '20261130-120000-ab12', 'rmsnorm', 2, 'col_tiled', '{"TILE_N": 128, "ACC": "float32"}', 'print(''two'')
', 'h2', '/tmp/c2.py', 'pass', 'ok', 0.25, 2, '{"compiles_on": ["sm_90a"], "spill_free_on": ["sm_90a"]}', '2026-11-30 12:00:20+00');
INSERT INTO public.candidate VALUES (3, NULL, 'rmsnorm', 0, NULL, '{}', 'print(''file'')
', 'h3', '/tmp/own.py', 'compile_error', 'SyntaxError', NULL, NULL, '{}', '2026-11-30 12:00:30+00');


--
-- Data for Name: ci_job; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.ci_job VALUES (1, 'e470ffc', 'pass', '{"operators": {"rmsnorm": {"operator": "x.py", "verdict": "pass", "worst_ratio": 0.25, "checks": {"smoke": true}}}, "regressions": []}', '/tmp/junit.xml', '2026-11-30 12:10:00+00', '2026-11-30 12:12:00+00');


--
-- Data for Name: kernel_build; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.kernel_build VALUES (1, 2, 'rmsnorm_fwd_kernel', 'sm_90a', 'model', '{"signature": {"X": "*bf16"}, "num_warps": 4}', true, '', 96, 0, 1024, 4, 3, 5, false, NULL, 0.4);
INSERT INTO public.kernel_build VALUES (2, 2, 'rmsnorm_bwd_kernel', 'gfx942', 'model', '{}', false, 'NameError: Cannot access global variable EPS', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.2);


--
-- Data for Name: loss_replay; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.loss_replay VALUES (1, 'kimi-k3.1-pro', 'scratch', 'tiny', 0, 'operators', 3, 'interpreter', '{"rmsnorm": "operators/rmsnorm/x.py", "band": 0.02}', '[2.5, 2.1, 1.9]', '[2.5, 2.1, 1.91]', 'pass', '', NULL, '{"host": "node-1", "pid": 4243}', '2026-11-30 12:07:00+00', '2026-11-30 12:08:00+00');
INSERT INTO public.loss_replay VALUES (2, 'kimi-k3.1-pro', 'lora', 'tiny', 1, 'reference', 2, 'interpreter', '{"all": "reference"}', '[3.0, 2.0]', '[3.0, 2.0]', 'reference', '', NULL, '{"key": "abc123", "result": {"curve": [3.0, 2.0]}}', '2026-11-30 12:09:00+00', '2026-11-30 12:09:00+00');


--
-- Data for Name: port_run; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.port_run VALUES ('20261130-120000-ab12', 'rmsnorm', 'kimi-k3.1-pro', 'search', 'interpreter', 4, 'promoted', 'passed every suite', '{"suites": ["smoke", "edge"], "targets": ["sm_90a"]}', 'operators/rmsnorm/x.py', 2, 'node-1', 4242, '2026-11-30 12:00:00+00', '2026-11-30 12:03:00+00');
INSERT INTO public.port_run VALUES ('20261130-130000-cd34', 'swiglu', NULL, 'llm', 'interpreter', 2, 'blocked', 'budget spent', '{}', NULL, NULL, 'node-2', NULL, '2026-11-30 13:00:00+00', NULL);


--
-- Data for Name: run_step; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.run_step VALUES (1, '20261130-120000-ab12', 1, 'plan', 'chose row_block', '{"points": 3}', '2026-11-30 12:00:01+00');
INSERT INTO public.run_step VALUES (2, '20261130-120000-ab12', 2, 'render', 'rendered one candidate', '{}', '2026-11-30 12:00:02+00');
INSERT INTO public.run_step VALUES (3, '20261130-120000-ab12', 3, 'verify', 'passed', '{"worst_ratio": 0.25}', '2026-11-30 12:00:03+00');


--
-- Data for Name: verification_check; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.verification_check VALUES (1, 1, 'interpreter', 'smoke', 'rows=4,N=64', 'float32', 0, 'forward:y', true, '', 1e-06, 2e-06, 0.1, 1e-05, 4e-06, 0);
INSERT INTO public.verification_check VALUES (2, 1, 'interpreter', 'edge', 'rows=1,N=123', 'float16', 1, 'grad:x', false, 'max abs err 0.5 > bound 0.25', 0.5, 0.1, 0.01, 0.1, 0.25, 2);
INSERT INTO public.verification_check VALUES (3, 2, 'interpreter', 'smoke', 'rows=4,N=64', 'float32', 0, 'forward:y', true, '', 1e-07, NULL, NULL, NULL, 4e-06, 0);


--
-- Name: benchmark_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.benchmark_id_seq', 2, true);


--
-- Name: candidate_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.candidate_id_seq', 3, true);


--
-- Name: ci_job_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.ci_job_id_seq', 1, true);


--
-- Name: kernel_build_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.kernel_build_id_seq', 2, true);


--
-- Name: loss_replay_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.loss_replay_id_seq', 2, true);


--
-- Name: run_step_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.run_step_id_seq', 3, true);


--
-- Name: verification_check_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.verification_check_id_seq', 3, true);


--
-- Name: benchmark benchmark_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.benchmark
    ADD CONSTRAINT benchmark_pkey PRIMARY KEY (id);


--
-- Name: candidate candidate_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.candidate
    ADD CONSTRAINT candidate_pkey PRIMARY KEY (id);


--
-- Name: ci_job ci_job_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ci_job
    ADD CONSTRAINT ci_job_pkey PRIMARY KEY (id);


--
-- Name: kernel_build kernel_build_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.kernel_build
    ADD CONSTRAINT kernel_build_pkey PRIMARY KEY (id);


--
-- Name: loss_replay loss_replay_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.loss_replay
    ADD CONSTRAINT loss_replay_pkey PRIMARY KEY (id);


--
-- Name: port_run port_run_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.port_run
    ADD CONSTRAINT port_run_pkey PRIMARY KEY (id);


--
-- Name: run_step run_step_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.run_step
    ADD CONSTRAINT run_step_pkey PRIMARY KEY (id);


--
-- Name: verification_check verification_check_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.verification_check
    ADD CONSTRAINT verification_check_pkey PRIMARY KEY (id);


--
-- Name: ix_benchmark_block; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_benchmark_block ON public.benchmark USING btree (block);


--
-- Name: ix_candidate_block; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_candidate_block ON public.candidate USING btree (block);


--
-- Name: ix_candidate_run_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_candidate_run_id ON public.candidate USING btree (run_id);


--
-- Name: ix_candidate_source_hash; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_candidate_source_hash ON public.candidate USING btree (source_hash);


--
-- Name: ix_kernel_build_candidate_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_kernel_build_candidate_id ON public.kernel_build USING btree (candidate_id);


--
-- Name: ix_kernel_build_target; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_kernel_build_target ON public.kernel_build USING btree (target);


--
-- Name: ix_port_run_block; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_port_run_block ON public.port_run USING btree (block);


--
-- Name: ix_port_run_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_port_run_status ON public.port_run USING btree (status);


--
-- Name: ix_run_step_run_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_run_step_run_id ON public.run_step USING btree (run_id);


--
-- Name: ix_verification_check_candidate_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_verification_check_candidate_id ON public.verification_check USING btree (candidate_id);


--
-- Name: benchmark benchmark_candidate_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.benchmark
    ADD CONSTRAINT benchmark_candidate_id_fkey FOREIGN KEY (candidate_id) REFERENCES public.candidate(id);


--
-- Name: candidate candidate_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.candidate
    ADD CONSTRAINT candidate_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.port_run(id);


--
-- Name: kernel_build kernel_build_candidate_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.kernel_build
    ADD CONSTRAINT kernel_build_candidate_id_fkey FOREIGN KEY (candidate_id) REFERENCES public.candidate(id);


--
-- Name: run_step run_step_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.run_step
    ADD CONSTRAINT run_step_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.port_run(id);


--
-- Name: verification_check verification_check_candidate_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.verification_check
    ADD CONSTRAINT verification_check_candidate_id_fkey FOREIGN KEY (candidate_id) REFERENCES public.candidate(id);


--
-- PostgreSQL database dump complete
--


