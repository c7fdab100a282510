"""The generated wire API, under short names: `from paddlecloud.api import pb, pb_grpc`."""

from paddlecloud.master.v1 import master_pb2 as pb
from paddlecloud.master.v1 import master_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Master"].full_name

__all__ = ["pb", "pb_grpc", "SERVICE_NAME"]
