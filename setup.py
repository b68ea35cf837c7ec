"""Installs hitoban. The area folders at the top level become sub-packages: modeling/ -> hitoban.modeling, etc."""

from setuptools import setup

AREAS = ["modeling", "training", "evaluation", "release"]
ROOMS = ["data", "pretrain", "finetune", "federated"]  # training/'s rooms, along the command line's stages

setup(
    name="hitoban",
    version="0.1.0",
    description="Train a small language model overnight on one GPU or Mac, measure it honestly, publish it safely.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",  # transformers 5.24 requires it
    # spaces/ is the Gradio Space exactly as uploaded (no __init__.py); it ships as data for `hitoban space`
    packages=["hitoban", "hitoban.data", "hitoban.verbs", "hitoban.spaces"] + [f"hitoban.{area}" for area in AREAS]
    + [f"hitoban.training.{room}" for room in ROOMS],
    package_dir={"hitoban": "hitoban", "hitoban.spaces": "spaces", **{f"hitoban.{area}": area for area in AREAS}},
    package_data={"hitoban.data": ["*.txt", "*.jsonl", "*.md"], "hitoban.spaces": ["*.py", "*.txt", "*.md"]},
    install_requires=[
        "torch>=2.4",
        # 5.24 renamed the cache kwarg (past_key_values -> cache); we follow that version's Llama and test it.
        "transformers==5.24.*",
        "accelerate>=1.10",
        "datasets>=4.0",
        "tokenizers>=0.22",
        "sentencepiece>=0.2",
        "protobuf>=4",  # SentencePiece's model format: export-llama writes llama.cpp's tokenizer.model
        "safetensors>=0.5",
        "huggingface_hub>=1.0",
        "evaluate>=0.4.5",
        "gradio>=5.0",
        "mmh3>=4.0",  # MurmurHash3 of each 5-gram for the near-duplicate signatures: a third of SHA-1's time
        "pyarrow>=15",
        # exact multi-pattern scans for `hitoban leaks`: hyperscan where wheels exist (x86), ahocorasick-rs always
        "hyperscan>=0.7; platform_machine == 'x86_64' or platform_machine == 'AMD64'",
        "ahocorasick-rs>=0.22",
        "faker>=25",  # fake ja_JP contacts for the PII probe's canary control
        "numpy>=1.26",
        "tqdm>=4.66",
        "matplotlib>=3.8",
    ],
    extras_require={
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100", "ruff>=0.6",
                # the near-duplicate step's oracle: training/data/near_duplicates.py makes datasketch's signatures,
                # bands and decisions without importing it (its package imports scipy: half a second a build)
                "datasketch>=2.0,<3",
                # the Hub test double, the Space client and browser tests
                "fastapi>=0.110", "uvicorn>=0.29", "gradio_client>=1.0", "selenium>=4.20",
                # transformers' own common model tests (tests/modeling/test_transformers_common.py) import it
                "parameterized>=0.9", "peft>=0.13",
                # hitoban export-gguf and its tests
                "gguf>=0.17",
                # hitoban federate and its tests (one environment with gradio: flwr pins fastapi/starlette)
                "flwr>=1.42,<1.43", "sentencepiece<0.2.3",
                # --report-to tensorboard / trackio and their tests (the event files and trackio's store read back)
                "tensorboard>=2.16", "trackio>=0.40",
                # the W&B (offline) and MLflow (a local sqlite store: SQLAlchemy + alembic) resume test, run
                # without network: mlflow-skinny is the client alone (~35 MB with wandb, ~15 s to install)
                "wandb>=0.19", "mlflow-skinny>=2.16", "sqlalchemy>=2", "alembic>=1.13"],
        "lora": ["peft>=0.13"],  # hitoban sft/tone --lora
        "gguf": ["gguf>=0.17"],  # hitoban export-gguf
        # hitoban federate: several machines on Flower (its Message API and HTTP SuperLink are 1.42's)
        # flwr requires protobuf < 7; sentencepiece 0.2.3's model proto requires protobuf >= 7 (its generated code
        # refuses an older runtime, breaking export-llama and every tokenizer.model), 0.2.2's works with both
        "federated": ["flwr>=1.42,<1.43", "sentencepiece<0.2.3"],
        # export-gguf --verify runs the file in llama.cpp; llama-cpp-python compiles llama.cpp (minutes)
        "llama": ["gguf>=0.17", "llama-cpp-python>=0.3.9"],
        # --report-to: Accelerate's trackers (pretrain) and the Trainer's (sft, tone); nothing is sent without one
        "tensorboard": ["tensorboard>=2.16"],
        "trackio": ["trackio>=0.40"],
        "wandb": ["wandb>=0.19"],
        "mlflow": ["mlflow>=2.16"],
    },
    entry_points={"console_scripts": ["hitoban=hitoban.cli:main"]},
)
