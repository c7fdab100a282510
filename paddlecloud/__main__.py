from paddlecloud.cli.main import main

main()
